#include "models/tiled_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <vector>

#include "attention_test_util.h"
#include "model_test_util.h"

namespace sd::models {
namespace {

// softmax(q kᵀ · scale) v by plain autograd ops, the definition the tiled kernel must reproduce.
at::Tensor plain_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  return at::bmm(at::softmax(at::bmm(q, k.transpose(1, 2)) * scale, -1), v);
}

using Grads = sd::test::AttentionGrads;
using sd::test::attention_grads;

TEST(TiledAttention, GradientsMatchFiniteDifferencesInFloat64) {
  at::manual_seed(11);
  // Tiles of 8 rows, the last one short: several tiles of several slices accumulate dk and dv.
  const int64_t slices = 3, lq = 37, lk = 11, d = 5, tile_rows = 8;
  const at::Tensor q = at::randn({slices, lq, d}, at::kDouble), k = at::randn({slices, lk, d}, at::kDouble),
                   v = at::randn({slices, lk, d}, at::kDouble), weight = at::randn({slices, lq, d}, at::kDouble);
  const double scale = 0.7;
  const Grads tiled = attention_grads(
      [&](auto& a, auto& b, auto& c) { return tiled_attention(a, b, c, scale, false, tile_rows); }, q, k, v, weight);
  auto loss = [&](const at::Tensor& qq, const at::Tensor& kk, const at::Tensor& vv) {
    torch::NoGradGuard no_grad;
    return (tiled_attention(qq, kk, vv, scale, false, tile_rows) * weight).sum().item<double>();
  };
  // float64: truncation ~h², rounding ~1e-16/h.
  const Grads numeric = sd::test::numeric_attention_grads(loss, q, k, v, /*h=*/1e-6);
  EXPECT_TRUE(sd::test::close_rel_max(tiled.dq, numeric.dq, 1e-7));
  EXPECT_TRUE(sd::test::close_rel_max(tiled.dk, numeric.dk, 1e-7));
  EXPECT_TRUE(sd::test::close_rel_max(tiled.dv, numeric.dv, 1e-7));
}

TEST(TiledAttention, EqualsPlainAutogradInFloat32WhateverTheThreadCount) {
  at::manual_seed(5);
  const int64_t slices = 5, lq = 300, lk = 77, d = 16;  // five slices over two threads: uneven work
  const at::Tensor q = at::randn({slices, lq, d}), k = at::randn({slices, lk, d}), v = at::randn({slices, lk, d}),
                   weight = at::randn({slices, lq, d});
  const double scale = 0.25;
  const Grads plain =
      attention_grads([&](auto& a, auto& b, auto& c) { return plain_attention(a, b, c, scale); }, q, k, v, weight);
  const int threads = at::get_num_threads();
  for (int n : {1, 2, 3}) {
    at::set_num_threads(n);
    const Grads tiled = attention_grads(
        [&](auto& a, auto& b, auto& c) { return tiled_attention(a, b, c, scale, false, 64); }, q, k, v, weight);
    // float32 with different summation orders (tiles, per-thread partial sums): a few ulps of the largest value.
    EXPECT_TRUE(sd::test::grads_close(tiled, plain, 1e-5)) << n << " threads";
  }
  at::set_num_threads(threads);
}

TEST(TiledAttention, RepeatedRunsAreBitIdentical) {
  // Exact resume needs every step to be reproducible: per-thread partial sums are added in a fixed order.
  at::manual_seed(6);
  const at::Tensor q = at::randn({4, 200, 8}), k = at::randn({4, 200, 8}), v = at::randn({4, 200, 8}),
                   weight = at::randn({4, 200, 8});
  auto tiled = [](auto& a, auto& b, auto& c) { return tiled_attention(a, b, c, 0.3, false, 48); };
  const Grads first = attention_grads(tiled, q, k, v, weight), second = attention_grads(tiled, q, k, v, weight);
  EXPECT_TRUE(at::equal(first.out, second.out));
  EXPECT_TRUE(at::equal(first.dq, second.dq));
  EXPECT_TRUE(at::equal(first.dk, second.dk));
  EXPECT_TRUE(at::equal(first.dv, second.dv));
}

TEST(TiledAttention, UpcastComputesScoresInFloat32AndIsANoOpForFloat32) {
  at::manual_seed(1);
  at::Tensor q = at::randn({2, 40, 16}).to(at::kBFloat16), k = at::randn({2, 30, 16}).to(at::kBFloat16);
  at::Tensor v = at::randn({2, 30, 16}).to(at::kBFloat16);
  const at::Tensor ref = plain_attention(q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble), 0.25);
  at::Tensor plain = tiled_attention(q, k, v, 0.25, false);
  at::Tensor upcast = tiled_attention(q, k, v, 0.25, true);
  EXPECT_EQ(upcast.scalar_type(), at::kBFloat16);
  // Float32 scores are rounded to bf16 only as probabilities, not before the softmax too.
  EXPECT_LE(sd::test::rel_l2(upcast, ref), sd::test::rel_l2(plain, ref));
  EXPECT_LE(sd::test::rel_l2(plain, ref), 3e-2);
  at::Tensor qf = q.to(at::kFloat), kf = k.to(at::kFloat), vf = v.to(at::kFloat);
  EXPECT_TRUE(at::equal(tiled_attention(qf, kf, vf, 0.25, true), tiled_attention(qf, kf, vf, 0.25, false)));
}

TEST(TiledAttention, Bf16KeepsItsDtypeAndUpcastScoresAreCloser) {
  at::manual_seed(8);
  const at::Tensor q = at::randn({2, 64, 16}), k = at::randn({2, 48, 16}), v = at::randn({2, 48, 16}),
                   weight = at::randn({2, 64, 16});
  const Grads reference =
      attention_grads([](auto& a, auto& b, auto& c) { return plain_attention(a, b, c, 0.25); }, q.to(at::kDouble),
                      k.to(at::kDouble), v.to(at::kDouble), weight.to(at::kDouble));
  const at::Tensor qb = q.to(at::kBFloat16), kb = k.to(at::kBFloat16), vb = v.to(at::kBFloat16);
  for (bool upcast : {false, true}) {
    const Grads bf16 =
        attention_grads([&](auto& a, auto& b, auto& c) { return tiled_attention(a, b, c, 0.25, upcast); }, qb, kb, vb,
                        weight.to(at::kBFloat16));
    EXPECT_EQ(bf16.out.scalar_type(), at::kBFloat16);
    EXPECT_EQ(bf16.dq.scalar_type(), at::kBFloat16);
    EXPECT_EQ(bf16.dk.scalar_type(), at::kBFloat16);
    EXPECT_LE(sd::test::rel_l2(bf16.out, reference.out), 2e-2) << "upcast " << upcast;
    EXPECT_LE(sd::test::rel_l2(bf16.dq, reference.dq), 5e-2) << "upcast " << upcast;
    EXPECT_LE(sd::test::rel_l2(bf16.dk, reference.dk), 5e-2) << "upcast " << upcast;
    EXPECT_LE(sd::test::rel_l2(bf16.dv, reference.dv), 5e-2) << "upcast " << upcast;
  }
}

// No queries give an empty output and empty gradients (no tiles to walk: the tile rows would be 0).
TEST(TiledAttention, NoQueriesGiveEmptyResults) {
  const at::Tensor q = at::randn({2, 0, 8}), k = at::randn({2, 5, 8}), v = at::randn({2, 5, 3});
  const Grads grads = attention_grads([](auto& a, auto& b, auto& c) { return tiled_attention(a, b, c, 0.5, false); }, q,
                                      k, v, at::randn({2, 0, 3}));
  EXPECT_EQ(grads.out.sizes(), at::IntArrayRef({2, 0, 3}));
  EXPECT_EQ(grads.dq.sizes(), q.sizes());
  EXPECT_TRUE(at::equal(grads.dk, at::zeros_like(k)));
  EXPECT_TRUE(at::equal(grads.dv, at::zeros_like(v)));
}

}  // namespace
}  // namespace sd::models
