#include "models/checkpoint.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "model_test_util.h"
#include "models/diffusers_blocks.h"

namespace sd::models {
namespace {

// A small float64 block with two outputs, a time embedding and cross-attention: the shape of a UNet block.
struct TinyBlock {
  ResnetBlock2D resnet{nullptr};
  Attention attn{nullptr};
  TinyBlock() {
    ResnetBlock2DOptions r;
    r.in_channels = 4;
    r.out_channels = 8;
    r.temb_channels = 6;
    r.groups = 2;
    resnet = ResnetBlock2D(r);
    AttentionOptions a;
    a.query_dim = 8;
    a.cross_attention_dim = 5;
    a.heads = 2;
    a.dim_head = 3;
    attn = Attention(a);
    resnet->to(at::kDouble);
    attn->to(at::kDouble);
    // Non-trivial norm affine parameters, so their gradients are exercised too.
    torch::NoGradGuard no_grad;
    for (auto& p : params()) p.copy_(at::randn_like(p) * 0.5);
  }
  TensorList params() const {
    TensorList p = resnet->parameters();
    for (const auto& t : attn->parameters()) p.push_back(t);
    return p;
  }
  TensorList operator()(const TensorList& in) const {
    at::Tensor h = resnet.ptr()->forward(in[0], in[1]);  // [2, 8, 3, 3]
    at::Tensor tokens = h.flatten(2).transpose(1, 2);    // [2, 9, 8]
    return {h, attn.ptr()->forward(tokens, in[2])};
  }
};

struct Inputs {
  at::Tensor x = at::randn({2, 4, 3, 3}, at::kDouble).requires_grad_(true);
  at::Tensor temb = at::randn({2, 6}, at::kDouble).requires_grad_(true);
  at::Tensor ctx = at::randn({2, 7, 5}, at::kDouble).requires_grad_(true);
  at::Tensor w0 = at::randn({2, 8, 3, 3}, at::kDouble);
  at::Tensor w1 = at::randn({2, 9, 8}, at::kDouble);
};

at::Tensor loss_of(const TensorList& out, const Inputs& in) { return (out[0] * in.w0).sum() + (out[1] * in.w1).sum(); }

TEST(Checkpoint, GradientsMatchFiniteDifferencesInFloat64) {
  at::manual_seed(7);
  TinyBlock block;
  Inputs in;
  const TensorList params = block.params();
  auto fn = [&](const TensorList& x) { return block(x); };

  TensorList out = checkpoint(fn, {in.x, in.temb, in.ctx}, params);
  ASSERT_EQ(out.size(), 2u);
  {
    torch::NoGradGuard no_grad;
    TensorList direct = block({in.x, in.temb, in.ctx});
    EXPECT_TRUE(at::equal(out[0], direct[0]));
    EXPECT_TRUE(at::equal(out[1], direct[1]));
  }
  loss_of(out, in).backward();

  // Central differences on every element of every input and parameter (float64: truncation ~h², rounding ~1e-16/h).
  TensorList wrt{in.x, in.temb, in.ctx};
  wrt.insert(wrt.end(), params.begin(), params.end());
  const double h = 1e-6;
  int checked = 0;
  for (const auto& t : wrt) {
    ASSERT_TRUE(t.grad().defined());
    at::Tensor numeric = at::zeros_like(t);
    torch::NoGradGuard no_grad;
    auto flat = t.view(-1);
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const double orig = flat[i].item<double>();
      flat[i].fill_(orig + h);
      const double up = loss_of(block({in.x, in.temb, in.ctx}), in).item<double>();
      flat[i].fill_(orig - h);
      const double down = loss_of(block({in.x, in.temb, in.ctx}), in).item<double>();
      flat[i].fill_(orig);
      numeric.view(-1)[i].fill_((up - down) / (2 * h));
    }
    EXPECT_TRUE(sd::test::close_rel_max(t.grad(), numeric, 1e-6)) << "tensor " << checked;
    ++checked;
  }
  EXPECT_EQ(checked, 3 + static_cast<int>(params.size()));
}

TEST(Checkpoint, EqualsPlainAutogradAndSkipsFrozenParameters) {
  at::manual_seed(8);
  TinyBlock block;
  Inputs in;
  TensorList params = block.params();
  params[0].requires_grad_(false);  // a frozen parameter gets no gradient
  auto fn = [&](const TensorList& x) { return block(x); };

  auto grads_of = [&](bool use_checkpoint) {
    for (auto* t : {&in.x, &in.temb, &in.ctx}) t->mutable_grad() = at::Tensor();
    for (auto& p : params) p.mutable_grad() = at::Tensor();
    TensorList out = use_checkpoint ? checkpoint(fn, {in.x, in.temb, in.ctx}, params) : block({in.x, in.temb, in.ctx});
    loss_of(out, in).backward();
    TensorList g{in.x.grad(), in.temb.grad(), in.ctx.grad()};
    for (auto& p : params) g.push_back(p.grad());
    return g;
  };
  TensorList plain = grads_of(false);
  TensorList ckpt = grads_of(true);
  ASSERT_EQ(plain.size(), ckpt.size());
  EXPECT_FALSE(ckpt[3].defined());  // params[0]
  for (size_t i = 0; i < plain.size(); ++i) {
    ASSERT_EQ(plain[i].defined(), ckpt[i].defined()) << i;
    if (plain[i].defined()) {
      EXPECT_TRUE(sd::test::close_rel_max(ckpt[i], plain[i], 1e-12)) << i;
    }
  }
}

TEST(Checkpoint, InputsWithoutGradientAndNoGradMode) {
  at::manual_seed(9);
  TinyBlock block;
  Inputs in;
  auto fn = [&](const TensorList& x) { return block(x); };
  // Only the context needs a gradient (frozen block, as in textual inversion); x carries none.
  for (auto& p : block.params()) p.requires_grad_(false);
  at::Tensor x = in.x.detach();
  TensorList out = checkpoint(fn, {x, in.temb.detach(), in.ctx}, block.params());
  loss_of(out, in).backward();
  ASSERT_TRUE(in.ctx.grad().defined());
  at::Tensor expected = torch::autograd::grad({loss_of(block({x, in.temb.detach(), in.ctx}), in)}, {in.ctx})[0];
  EXPECT_TRUE(sd::test::close_rel_max(in.ctx.grad(), expected, 1e-12));

  torch::NoGradGuard no_grad;
  TensorList plain = checkpoint(fn, {in.x, in.temb, in.ctx}, block.params());
  EXPECT_FALSE(plain[0].requires_grad());
}

}  // namespace
}  // namespace sd::models
