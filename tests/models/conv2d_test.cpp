#include "models/conv2d.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <utility>
#include <vector>

#include "model_test_util.h"
#include "models/lora.h"

namespace sd::models {
namespace {

struct Result {
  at::Tensor out, dx, dw, db;
};

template <typename Conv>
Result run(const Conv& conv, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& b0, const at::Tensor& grad) {
  at::Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_();
  at::Tensor b = b0.defined() ? b0.detach().requires_grad_() : at::Tensor();
  const at::Tensor out = conv(x, w, b);
  torch::autograd::backward({out}, {grad});
  return {out.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : at::Tensor()};
}

struct Shape {
  int64_t batch, in, out, kernel, height, width, stride, padding;
  bool bias;
};

TEST(Conv2d, GemmPathEqualsLibTorchsConvolutionForwardAndBackward) {
  const std::vector<Shape> shapes = {
      {1, 8, 6, 3, 5, 5, 1, 1, true},   // SD's resnet convolution
      {3, 8, 6, 3, 5, 7, 1, 1, true},   // several images, a non-square map
      {2, 5, 4, 3, 6, 6, 2, 0, true},   // the VAE's downsampler (stride 2, no padding)
      {2, 5, 4, 3, 7, 6, 2, 1, false},  // the UNet's downsampler, odd size, no bias
      {2, 9, 3, 1, 4, 4, 1, 0, true},   // 1x1 projection or shortcut
  };
  for (const at::ScalarType dtype : {at::kDouble, at::kFloat, at::kBFloat16}) {
    for (const Shape& s : shapes) {
      SCOPED_TRACE(::testing::Message() << c10::toString(dtype) << " batch " << s.batch << " kernel " << s.kernel
                                        << " stride " << s.stride << " padding " << s.padding);
      at::manual_seed(s.batch * 100 + s.kernel);
      const at::Tensor x = at::randn({s.batch, s.in, s.height, s.width}, dtype);
      const at::Tensor w = at::randn({s.out, s.in, s.kernel, s.kernel}, dtype);
      const at::Tensor b = s.bias ? at::randn({s.out}, dtype) : at::Tensor();
      const std::vector<int64_t> stride{s.stride, s.stride}, padding{s.padding, s.padding};
      const at::Tensor grad = at::randn_like(at::conv2d(x, w, b, stride, padding));
      const Result ref =
          run([&](auto& a, auto& c, auto& d) { return at::conv2d(a, c, d, stride, padding); }, x, w, b, grad);
      const Result gemm =
          run([&](auto& a, auto& c, auto& d) { return conv2d_as_gemm(a, c, d, stride, padding); }, x, w, b, grad);
      // Summation order only; bf16 also rounds the products' inputs and outputs.
      const double tol = dtype == at::kDouble ? 1e-12 : dtype == at::kFloat ? 1e-5 : 2e-2;
      EXPECT_TRUE(sd::test::close_rel_max(gemm.out, ref.out, tol));
      EXPECT_TRUE(sd::test::close_rel_max(gemm.dx, ref.dx, tol));
      EXPECT_TRUE(sd::test::close_rel_max(gemm.dw, ref.dw, tol));
      if (s.bias) {
        EXPECT_TRUE(sd::test::close_rel_max(gemm.db, ref.db, tol));
      }
      EXPECT_TRUE(gemm.out.is_contiguous());
    }
  }
}

// The GEMM path's backward (its own for float32 maps of up to 64 pixels, autograd's for bf16) gives only the gradients
// autograd asks for, each LibTorch's: a frozen weight without a kept transpose, or an input that needs no gradient (the
// UNet's first convolution).
TEST(Conv2d, GemmPathComputesOnlyTheGradientsAsked) {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    at::manual_seed(3);
    const at::Tensor x0 = at::randn({1, 6, 4, 4}, dtype), w0 = at::randn({5, 6, 3, 3}, dtype),
                     b0 = at::randn({5}, dtype), grad = at::randn({1, 5, 4, 4}, dtype);
    const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
    for (const bool input_needs_grad : {false, true}) {
      const at::Tensor x = x0.detach().requires_grad_(input_needs_grad),
                       w = w0.detach().requires_grad_(!input_needs_grad),
                       b = b0.detach().requires_grad_(!input_needs_grad);
      conv2d_as_gemm(x, w, b, {1, 1}, {1, 1}).backward(grad);
      const at::Tensor xr = x0.detach().requires_grad_(), wr = w0.detach().requires_grad_(),
                       br = b0.detach().requires_grad_();
      at::conv2d(xr, wr, br, {1, 1}, {1, 1}).backward(grad);
      EXPECT_EQ(x.grad().defined(), input_needs_grad);
      EXPECT_EQ(w.grad().defined(), !input_needs_grad);
      if (input_needs_grad) {
        EXPECT_TRUE(sd::test::close_rel_max(x.grad(), xr.grad(), tol));
      } else {
        EXPECT_TRUE(sd::test::close_rel_max(w.grad(), wr.grad(), tol));
        EXPECT_TRUE(sd::test::close_rel_max(b.grad(), br.grad(), tol));
      }
    }
  }
}

TEST(Conv2d, SmallMapsTakeTheGemmPathAndEverythingElseLibTorchs) {
  const std::vector<int64_t> one{1, 1}, two{2, 2}, zero{0, 0};
  const at::Tensor w3 = at::zeros({4, 4, 3, 3});
  EXPECT_TRUE(conv2d_runs_as_gemm(at::zeros({1, 4, 16, 16}), w3, one, one));   // 256 output pixels
  EXPECT_TRUE(conv2d_runs_as_gemm(at::zeros({4, 4, 8, 8}), w3, one, one));     // 4 x 64
  EXPECT_TRUE(conv2d_runs_as_gemm(at::zeros({1, 4, 32, 32}), w3, two, one));   // 16 x 16 after stride 2
  EXPECT_FALSE(conv2d_runs_as_gemm(at::zeros({1, 4, 32, 32}), w3, one, one));  // 1024
  EXPECT_FALSE(conv2d_runs_as_gemm(at::zeros({2, 4, 16, 16}), w3, one, one));  // 512
  EXPECT_FALSE(conv2d_runs_as_gemm(at::zeros({1, 4, 8, 8}, at::kDouble), w3.to(at::kDouble), one, one));
  // bf16: 3x3 on maps of at most 8x8 (256 pixels at most), 1x1 up to 1024 pixels.
  const auto bf16 = [](const at::Tensor& t) { return t.to(at::kBFloat16); };
  const at::Tensor w1 = at::zeros({4, 4, 1, 1});
  EXPECT_TRUE(conv2d_runs_as_gemm(bf16(at::zeros({1, 4, 8, 8})), bf16(w3), one, one));
  EXPECT_TRUE(conv2d_runs_as_gemm(bf16(at::zeros({4, 4, 8, 8})), bf16(w3), one, one));
  EXPECT_FALSE(conv2d_runs_as_gemm(bf16(at::zeros({8, 4, 8, 8})), bf16(w3), one, one));    // 512
  EXPECT_FALSE(conv2d_runs_as_gemm(bf16(at::zeros({1, 4, 16, 16})), bf16(w3), one, one));  // a 16x16 map
  EXPECT_TRUE(conv2d_runs_as_gemm(bf16(at::zeros({1, 4, 32, 32})), bf16(w1), one, zero));
  EXPECT_FALSE(conv2d_runs_as_gemm(bf16(at::zeros({2, 4, 32, 32})), bf16(w1), one, zero));  // 2048
  EXPECT_FALSE(conv2d_runs_as_gemm(at::zeros({1, 4, 32, 32}), w1, one, zero));              // float32: 1024 pixels
  // Whichever path it takes, conv2d() computes the convolution.
  const at::Tensor x = at::randn({1, 4, 8, 8}), w = at::randn({4, 4, 3, 3}), b = at::randn({4});
  EXPECT_TRUE(sd::test::close_rel_max(conv2d(x, w, b, one, one), at::conv2d(x, w, b, one, one), 1e-5));
  const at::Tensor big = at::randn({1, 4, 20, 20});
  EXPECT_TRUE(at::equal(conv2d(big, w, b, one, zero), at::conv2d(big, w, b, one, zero)));
  // In bf16 both paths round their products to bf16 and accumulate in float32, in different orders.
  EXPECT_TRUE(sd::test::close_rel_max(conv2d(bf16(x), bf16(w), bf16(b), one, one).to(at::kFloat),
                                      at::conv2d(bf16(x), bf16(w), bf16(b), one, one).to(at::kFloat), 2e-2));
}

// Training through a frozen layer (textual inversion, LoRA): the input gradient comes from the weight's kept
// transpose, equal to LibTorch's; the transpose is remade when the weight changes and never made for a trained one.
// 3x3 layers take patch columns, 1x1 layers their input maps as they are.
TEST(Conv2d, FrozenLayerTakesTheInputGradientFromItsKeptTranspose) {
  for (const auto& [dtype, with_bias, kernel] : std::vector<std::tuple<at::ScalarType, bool, int64_t>>{
           {at::kFloat, true, 3}, {at::kBFloat16, true, 3}, {at::kBFloat16, false, 3}, {at::kBFloat16, true, 1}}) {
    SCOPED_TRACE(fmt::format("{} bias {} kernel {}", c10::toString(dtype), with_bias, kernel));
    const int64_t padding = kernel / 2;
    Conv2d conv(torch::nn::Conv2dOptions(6, 5, kernel).padding(padding).bias(with_bias));
    conv->to(dtype);
    for (auto& p : conv->parameters()) p.set_requires_grad(false);
    const at::Tensor x0 = at::randn({2, 6, 4, 4}).to(dtype), grad = at::randn({2, 5, 4, 4}).to(dtype);
    const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;  // bf16: products rounded, sums in another order
    ASSERT_TRUE(conv2d_runs_as_gemm(x0, conv->weight, {1, 1}, {padding, padding}));
    auto input_gradient = [&] {
      const at::Tensor x = x0.detach().requires_grad_(true);
      const at::Tensor out = conv->forward(x);
      EXPECT_TRUE(sd::test::close_rel_max(out, at::conv2d(x0, conv->weight, conv->bias, 1, padding), tol));
      out.backward(grad);
      return x.grad();
    };
    auto reference_gradient = [&] {
      const at::Tensor x = x0.detach().requires_grad_(true);
      at::conv2d(x, conv->weight, conv->bias, 1, padding).backward(grad);
      return x.grad();
    };
    EXPECT_EQ(conv->frozen_weight_bytes(), 0);
    EXPECT_TRUE(sd::test::close_rel_max(input_gradient(), reference_gradient(), tol));
    EXPECT_GE(conv->frozen_weight_bytes(), conv->weight.nbytes());
    {
      torch::NoGradGuard no_grad;
      conv->weight.mul_(-2);  // e.g. a LoRA merged into the weight
    }
    EXPECT_TRUE(sd::test::close_rel_max(input_gradient(), reference_gradient(), tol));
    conv->weight.set_data(at::randn_like(conv->weight));  // e.g. weights loaded anew
    EXPECT_TRUE(sd::test::close_rel_max(input_gradient(), reference_gradient(), tol));

    Conv2d trained(torch::nn::Conv2dOptions(6, 5, kernel).padding(padding).bias(with_bias));
    trained->to(dtype);
    trained->forward(x0.detach().requires_grad_(true)).sum().backward();
    EXPECT_EQ(trained->frozen_weight_bytes(), 0);
    EXPECT_TRUE(trained->weight.grad().defined());
    // The frozen layer's products (oneDNN's, for bf16) are those of the trainable one's at::addmm, to the bit.
    trained->weight.set_data(conv->weight.detach().clone());
    if (with_bias) trained->bias.set_data(conv->bias.detach().clone());
    EXPECT_TRUE(
        at::equal(conv->forward(x0.detach().requires_grad_(true)), trained->forward(x0.detach().requires_grad_(true))));
  }
}

}  // namespace
}  // namespace sd::models
