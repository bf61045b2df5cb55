#include "models/im2col.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <vector>

#include "core/error.h"

namespace sd::models {
namespace {

struct Case {
  int64_t batch, channels, height, width, kernel, padding, stride;
};

// SD's 3x3 convolution, the VAE's and the UNet's downsamplers on odd and even maps, a kernel wider than the
// padding can cover, a padded 1x1 kernel, a map the size of the kernel, a row long enough (37 pixels) for several of
// unfold's fixed-size moves, and every row shape the kernels unroll (16, 8 and 4 pixels at stride 1, 8 and 4 at
// stride 2), one of them under a 5x5 kernel.
const std::vector<Case> kCases = {
    {1, 3, 5, 5, 3, 1, 1},   {2, 4, 6, 7, 3, 1, 1},   {2, 3, 6, 6, 3, 0, 2}, {2, 3, 7, 6, 3, 1, 2},
    {1, 2, 4, 9, 5, 1, 1},   {1, 2, 3, 4, 1, 1, 1},   {3, 2, 3, 3, 3, 0, 1}, {1, 2, 9, 8, 4, 2, 3},
    {1, 2, 5, 37, 3, 1, 1},  {2, 2, 16, 16, 3, 1, 1}, {1, 2, 8, 8, 3, 1, 1}, {2, 2, 4, 4, 3, 1, 1},
    {1, 2, 16, 16, 3, 1, 2}, {1, 2, 8, 8, 3, 1, 2},   {1, 2, 8, 8, 5, 2, 1},
};

at::Tensor libtorch_im2col(const at::Tensor& x, const Case& c) {
  return at::im2col(x, {c.kernel, c.kernel}, /*dilation=*/{1, 1}, {c.padding, c.padding}, {c.stride, c.stride});
}

at::Tensor fold(const at::Tensor& columns, const Case& c) {
  return fold_patches(columns, {c.height, c.width}, {c.kernel, c.kernel}, {c.padding, c.padding}, {c.stride, c.stride});
}

at::Tensor unfold(const at::Tensor& x, const Case& c) {
  return unfold_patches(x, {c.kernel, c.kernel}, {c.padding, c.padding}, {c.stride, c.stride});
}

::testing::Message describe(const Case& c, at::ScalarType dtype) {
  return ::testing::Message() << c10::toString(dtype) << " " << c.batch << "x" << c.channels << "x" << c.height << "x"
                              << c.width << " kernel " << c.kernel << " padding " << c.padding << " stride "
                              << c.stride;
}

TEST(Im2col, UnfoldCopiesWhatLibTorchsIm2colCopies) {
  for (const at::ScalarType dtype : {at::kDouble, at::kFloat, at::kBFloat16})
    for (const Case& c : kCases) {
      SCOPED_TRACE(describe(c, dtype));
      at::manual_seed(c.height * 10 + c.kernel);
      const at::Tensor x = at::randn({c.batch, c.channels, c.height, c.width}).to(dtype);
      const at::Tensor ours = unfold(x, c);
      EXPECT_TRUE(at::equal(ours, libtorch_im2col(x, c)));
      // A non-contiguous map reads the same numbers.
      EXPECT_TRUE(at::equal(unfold(x.transpose(2, 3).contiguous().transpose(2, 3), c), ours));
    }
}

// Sums in the same order as at::col2im, so float32 and float64 agree bit for bit.
TEST(Im2col, FoldSumsLikeLibTorchsCol2im) {
  for (const at::ScalarType dtype : {at::kDouble, at::kFloat})
    for (const Case& c : kCases) {
      SCOPED_TRACE(describe(c, dtype));
      at::manual_seed(c.width * 10 + c.stride);
      const int64_t out_pixels = libtorch_im2col(at::zeros({1, 1, c.height, c.width}), c).size(2);
      const at::Tensor columns = at::randn({c.batch, c.channels * c.kernel * c.kernel, out_pixels}, dtype);
      const at::Tensor expected = at::col2im(columns, {c.height, c.width}, {c.kernel, c.kernel}, /*dilation=*/{1, 1},
                                             {c.padding, c.padding}, {c.stride, c.stride});
      EXPECT_TRUE(at::equal(fold(columns, c), expected));
    }
}

// bf16 columns are summed in float32 and rounded once (LibTorch's col2im rounds after every addition).
TEST(Im2col, Bf16FoldRoundsTheFloat32SumOnce) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c, at::kBFloat16));
    at::manual_seed(c.channels * 10 + c.padding);
    const int64_t out_pixels = libtorch_im2col(at::zeros({1, 1, c.height, c.width}), c).size(2);
    const at::Tensor columns = at::randn({c.batch, c.channels * c.kernel * c.kernel, out_pixels}).to(at::kBFloat16);
    EXPECT_TRUE(at::equal(fold(columns, c), fold(columns.to(at::kFloat), c).to(at::kBFloat16)));
  }
}

// The backward of unfold_patches against central differences of <unfold(x), w> in float64.
TEST(Im2col, UnfoldGradientMatchesFiniteDifferences) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c, at::kDouble));
    at::manual_seed(c.batch * 10 + c.height);
    const at::Tensor x0 = at::randn({c.batch, c.channels, c.height, c.width}, at::kDouble);
    const at::Tensor weight = at::randn_like(libtorch_im2col(x0, c));
    const at::Tensor x = x0.clone().requires_grad_();
    (unfold(x, c) * weight).sum().backward();
    const at::Tensor analytic = x.grad();

    at::NoGradGuard no_grad;
    const double h = 1e-6;
    at::Tensor probe = x0.clone(), numeric = at::zeros_like(x0);
    auto flat = probe.view(-1);
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const double orig = flat[i].item<double>();
      flat[i].fill_(orig + h);
      const double up = (unfold(probe, c) * weight).sum().item<double>();
      flat[i].fill_(orig - h);
      const double down = (unfold(probe, c) * weight).sum().item<double>();
      flat[i].fill_(orig);
      numeric.view(-1)[i].fill_((up - down) / (2 * h));
    }
    EXPECT_TRUE(at::allclose(analytic, numeric, /*rtol=*/1e-6, /*atol=*/1e-8));
  }
}

TEST(Im2col, BadShapesAreNamed) {
  const at::Tensor map = at::zeros({1, 2, 4, 4});
  EXPECT_THROW(unfold_patches(map.flatten(2), {3, 3}, {1, 1}, {1, 1}), Error);  // not [N, C, H, W]
  EXPECT_THROW(unfold_patches(map, {7, 7}, {1, 1}, {1, 1}), Error);             // kernel larger than the padded map
  EXPECT_THROW(unfold_patches(map, {3, 3}, {1, 1}, {0, 1}), Error);             // zero stride
  EXPECT_THROW(unfold_patches(map, {3}, {1, 1}, {1, 1}), Error);                // one kernel size
  EXPECT_THROW(fold_patches(at::zeros({1, 17, 16}), {4, 4}, {3, 3}, {1, 1}, {1, 1}), Error);  // 17 rows: not C·9
  EXPECT_THROW(fold_patches(at::zeros({1, 18, 15}), {4, 4}, {3, 3}, {1, 1}, {1, 1}), Error);  // 15 of 16 pixels
}

}  // namespace
}  // namespace sd::models
