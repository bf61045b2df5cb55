#include "models/small_head_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "model_test_util.h"
#include "models/diffusers_blocks.h"

namespace sd::models {
namespace {

// The attention kernels' test helpers (attention_test_util.h).
using namespace sd::test;
using Case = AttentionCase;
using Inputs = AttentionInputs;
using Grads = AttentionGrads;

// tiny-sd1's self- and cross-attention (8 heads of 4 over 256 tokens, 8 of 8 against 77 text tokens), keys fewer
// than a vector and not a multiple of one, heads of 1, 6 and 16 channels.
const std::vector<Case> kCases = {
    {2, 8, 256, 256, 4}, {2, 8, 64, 77, 8}, {1, 3, 5, 3, 16}, {3, 2, 17, 9, 1}, {1, 1, 40, 13, 6}};

TEST(SmallHeadAttention, GradientsMatchFiniteDifferences) {
  for (const int bits : vector_widths()) {
    SCOPED_TRACE(::testing::Message() << bits << "-bit vectors");
    const VectorWidth width(bits);
    at::manual_seed(3);
    const Case c{2, 2, 7, 11, 3};
    const Inputs in = random_inputs(c, at::kFloat);
    expect_float32_gradients_match_finite_differences(
        [&](auto& q, auto& k, auto& v) { return small_head_attention(q, k, v, c.heads, /*scale=*/0.6, false); }, in);
  }
}

TEST(SmallHeadAttention, EqualsDiffusersPathInFloat32WhateverTheThreadsAndVectorWidth) {
  const int threads = at::get_num_threads();
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    at::manual_seed(c.lq + c.d);
    const Inputs in = random_inputs(c, at::kFloat);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    const Grads reference =
        attention_grads([&](auto& q, auto& k, auto& v) { return reference_attention(q, k, v, c.heads, scale, false); },
                        in.q, in.k, in.v, in.weight);
    for (const int bits : vector_widths()) {
      const VectorWidth width(bits);
      for (int n : {1, 2, 3}) {
        at::set_num_threads(n);
        const Grads fused = attention_grads(
            [&](auto& q, auto& k, auto& v) { return small_head_attention(q, k, v, c.heads, scale, false); }, in.q, in.k,
            in.v, in.weight);
        // Different summation orders and a polynomial exp (≤ 2 ulp): a few ulps of the largest value.
        EXPECT_TRUE(grads_close(fused, reference, 1e-5)) << n << " threads, " << bits << "-bit vectors";
      }
    }
  }
  at::set_num_threads(threads);
}

// bf16 rounds where diffusers' bf16 path rounds in the forward pass (scores, probabilities, output), so the outputs
// agree to a bf16 step or two (a score or probability near a rounding boundary can round the other way); the backward
// pass keeps float32 until it writes, so its gradients are at least as close to the float64 truth as the reference's.
TEST(SmallHeadAttention, Bf16RoundsLikeDiffusersForwardAndBackwardIsNoWorse) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    at::manual_seed(c.lk + c.d);
    const Inputs in = random_inputs(c, at::kBFloat16);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    for (bool upcast : {false, true}) {
      SCOPED_TRACE(upcast ? "upcast_attention" : "bf16 scores");
      const Grads truth = attention_grads(
          [&](auto& q, auto& k, auto& v) { return reference_attention(q, k, v, c.heads, scale, upcast); },
          in.q.to(at::kDouble), in.k.to(at::kDouble), in.v.to(at::kDouble), in.weight.to(at::kDouble));
      const Grads reference = attention_grads(
          [&](auto& q, auto& k, auto& v) { return reference_attention(q, k, v, c.heads, scale, upcast); }, in.q, in.k,
          in.v, in.weight);
      for (const int bits : vector_widths()) {
        SCOPED_TRACE(::testing::Message() << bits << "-bit vectors");
        const VectorWidth width(bits);
        const Grads fused = attention_grads(
            [&](auto& q, auto& k, auto& v) { return small_head_attention(q, k, v, c.heads, scale, upcast); }, in.q,
            in.k, in.v, in.weight);
        EXPECT_EQ(fused.out.scalar_type(), at::kBFloat16);
        EXPECT_EQ(fused.dq.scalar_type(), at::kBFloat16);
        EXPECT_TRUE(close_rel_max(fused.out, reference.out, 1.0 / 64));
        const std::vector<std::pair<at::Tensor, at::Tensor>> grads = {
            {fused.dq, reference.dq}, {fused.dk, reference.dk}, {fused.dv, reference.dv}};
        const std::vector<at::Tensor> true_grads = {truth.dq, truth.dk, truth.dv};
        for (size_t g = 0; g < grads.size(); ++g)
          EXPECT_LE(rel_l2(grads[g].first, true_grads[g]), 1.05 * rel_l2(grads[g].second, true_grads[g]) + 1e-3)
              << "gradient " << g;
      }
    }
  }
}

// Causal attention as transformers' CLIPAttention computes it: the scores (rounded to the inputs' dtype) plus the
// dtype's lowest value above the diagonal, the softmax in float32, the probabilities in v's dtype.
at::Tensor causal_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                            double scale) {
  const at::Tensor qh = split_heads(q, heads), kh = split_heads(k, heads), vh = split_heads(v, heads);
  const at::Tensor scores = at::baddbmm(at::empty({qh.size(0), qh.size(1), kh.size(1)}, qh.options()), qh,
                                        kh.transpose(1, 2), /*beta=*/0, /*alpha=*/scale);
  const at::Tensor mask =
      at::full({q.size(1), k.size(1)}, std::numeric_limits<float>::lowest(), scores.options().dtype(at::kFloat))
          .triu(1);
  return merge_heads(at::bmm((scores.to(at::kFloat) + mask).softmax(-1).to(v.scalar_type()), vh), heads);
}

// Under a causal mask each query row stops at its own key, in both widths and dtypes: float32 agrees with the
// masked reference to a few ulps, bf16 rounds where it rounds (tiny-sd1's text encoder: 4 heads of 8 over 77 tokens).
TEST(SmallHeadAttention, CausalEqualsTheMaskedReference) {
  for (const Case& c : std::vector<Case>{{2, 4, 77, 77, 8}, {1, 3, 20, 20, 5}, {2, 2, 33, 33, 16}}) {
    SCOPED_TRACE(describe(c));
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(c10::toString(dtype));
      at::manual_seed(c.lq + c.d);
      const Inputs in = random_inputs(c, dtype);
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
      auto reference = [&](auto& q, auto& k, auto& v) { return causal_reference(q, k, v, c.heads, scale); };
      const Grads expected = attention_grads(reference, in.q, in.k, in.v, in.weight);
      const Grads truth = attention_grads(reference, in.q.to(at::kDouble), in.k.to(at::kDouble), in.v.to(at::kDouble),
                                          in.weight.to(at::kDouble));
      for (const int bits : vector_widths()) {
        SCOPED_TRACE(::testing::Message() << bits << "-bit vectors");
        const VectorWidth width(bits);
        const Grads fused = attention_grads(
            [&](auto& q, auto& k, auto& v) { return small_head_attention(q, k, v, c.heads, scale, false, true); }, in.q,
            in.k, in.v, in.weight);
        if (dtype == at::kFloat) {
          EXPECT_TRUE(grads_close(fused, expected, 1e-5));
          continue;
        }
        EXPECT_TRUE(close_rel_max(fused.out, expected.out, 1.0 / 64));
        EXPECT_LE(rel_l2(fused.dq, truth.dq), 1.05 * rel_l2(expected.dq, truth.dq) + 1e-3);
        EXPECT_LE(rel_l2(fused.dk, truth.dk), 1.05 * rel_l2(expected.dk, truth.dk) + 1e-3);
        EXPECT_LE(rel_l2(fused.dv, truth.dv), 1.05 * rel_l2(expected.dv, truth.dv) + 1e-3);
      }
    }
  }
}

TEST(SmallHeadAttention, ReadsStridedInputsAndRepeatsBitForBit) {
  at::manual_seed(4);
  const Case c{2, 8, 50, 30, 4};
  const Inputs in = random_inputs(c, at::kBFloat16);
  auto fused = [&](auto& q, auto& k, auto& v) { return small_head_attention(q, k, v, c.heads, 0.5, false); };
  const Grads first = attention_grads(fused, in.q, in.k, in.v, in.weight),
              second = attention_grads(fused, in.q, in.k, in.v, in.weight);
  EXPECT_TRUE(at::equal(first.out, second.out));
  EXPECT_TRUE(at::equal(first.dq, second.dq));
  EXPECT_TRUE(at::equal(first.dk, second.dk));
  EXPECT_TRUE(at::equal(first.dv, second.dv));
  // k as a non-contiguous view of the same numbers.
  const at::Tensor k_strided = in.k.transpose(0, 1).contiguous().transpose(0, 1);
  ASSERT_FALSE(k_strided.is_contiguous());
  EXPECT_TRUE(at::equal(fused(in.q, k_strided, in.v), first.out));
}

// Forward keeps the probabilities of problems up to 2^22 scores for backward; larger ones recompute them from q, k
// and each row's stats. Rows are independent, so the query rows of a large problem, taken in two halves that each
// keep their probabilities, give the same output and dq bit for bit, and dk and dv up to the order of their sums.
TEST(SmallHeadAttention, RecomputedProbabilitiesGiveTheKeptOnesGradients) {
  for (const int bits : vector_widths()) {
    SCOPED_TRACE(::testing::Message() << bits << "-bit vectors");
    const VectorWidth width(bits);
    at::manual_seed(6);
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      const Case c{1, 1, 2080, 2048, 4};  // 2080 x 2048 scores: recomputed; each half: kept
      const Inputs in = random_inputs(c, dtype);
      auto fused = [&](auto& q, auto& k, auto& v) { return small_head_attention(q, k, v, c.heads, 0.5, false); };
      const Grads whole = attention_grads(fused, in.q, in.k, in.v, in.weight);
      Grads halves[2];
      for (int half = 0; half < 2; ++half) {
        const at::Tensor rows = at::arange(half * c.lq / 2, (half + 1) * c.lq / 2);
        halves[half] = attention_grads(fused, in.q.index_select(1, rows), in.k, in.v, in.weight.index_select(1, rows));
      }
      SCOPED_TRACE(c10::toString(dtype));
      EXPECT_TRUE(at::equal(whole.out, at::cat({halves[0].out, halves[1].out}, 1)));
      EXPECT_TRUE(at::equal(whole.dq, at::cat({halves[0].dq, halves[1].dq}, 1)));
      const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
      EXPECT_TRUE(close_rel_max(whole.dk, halves[0].dk.to(at::kFloat) + halves[1].dk.to(at::kFloat), tol));
      EXPECT_TRUE(close_rel_max(whole.dv, halves[0].dv.to(at::kFloat) + halves[1].dv.to(at::kFloat), tol));
    }
  }
}

// Over kept probabilities backward sums dk and dv over the rows in registers; recomputing them, it adds each row's
// share in memory (backward_row). Both take the same sums in the same order, causal mask or not (tiny CLIP's 77
// tokens in heads of 8 as well).
TEST(SmallHeadAttention, KeptAndRecomputedProbabilitiesGiveTheSameGradientsBitForBit) {
  std::vector<Case> cases = kCases;
  cases.push_back({2, 4, 77, 77, 8});
  for (const int bits : vector_widths()) {
    const VectorWidth width(bits);
    for (const Case& c : cases) {
      for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
        for (const bool causal : {false, true}) {
          if (causal && c.lq != c.lk) continue;
          SCOPED_TRACE(::testing::Message() << bits << "-bit vectors, " << describe(c) << ", " << c10::toString(dtype)
                                            << (causal ? ", causal" : ""));
          at::manual_seed(c.lq * 7 + c.d);
          const Inputs in = random_inputs(c, dtype);
          auto fused = [&](bool keep) {
            return attention_grads(
                [&](auto& q, auto& k, auto& v) {
                  return small_head_attention(q, k, v, c.heads, 0.5, false, causal, keep);
                },
                in.q, in.k, in.v, in.weight);
          };
          const Grads kept = fused(true), recomputed = fused(false);
          EXPECT_TRUE(at::equal(kept.out, recomputed.out));
          EXPECT_TRUE(at::equal(kept.dq, recomputed.dq));
          EXPECT_TRUE(at::equal(kept.dk, recomputed.dk));
          EXPECT_TRUE(at::equal(kept.dv, recomputed.dv));
        }
      }
    }
  }
}

// A NaN reaches the outputs it touches, as in the reference, so a diverging run is noticed rather than hidden.
TEST(SmallHeadAttention, NanReachesTheRowsItTouches) {
  for (const int bits : vector_widths()) {
    SCOPED_TRACE(::testing::Message() << bits << "-bit vectors");
    const VectorWidth width(bits);
    at::manual_seed(2);
    const Case c{1, 2, 6, 9, 4};
    const Inputs in = random_inputs(c, at::kFloat);
    at::Tensor q = in.q.clone();
    q[0][3][1] = NAN;  // query 3 of head 0
    const at::Tensor out = small_head_attention(q, in.k, in.v, c.heads, 0.5, false);
    const at::Tensor nan_rows = out.isnan().any(-1)[0];
    EXPECT_TRUE(at::equal(nan_rows, at::arange(6).eq(3))) << nan_rows;
    EXPECT_TRUE(out[0][3].slice(0, 0, 4).isnan().all().item<bool>());   // head 0's channels
    EXPECT_FALSE(out[0][3].slice(0, 4, 8).isnan().any().item<bool>());  // head 1's
    at::Tensor k = in.k.clone();
    k[0][5][6] = NAN;  // key 5 of head 1: every query of head 1
    const at::Tensor out_k = small_head_attention(in.q, k, in.v, c.heads, 0.5, false);
    EXPECT_TRUE(out_k.slice(2, 4, 8).isnan().all().item<bool>());
    EXPECT_FALSE(out_k.slice(2, 0, 4).isnan().any().item<bool>());
  }
}

TEST(SmallHeadAttention, FitsOnlyWhatItComputes) {
  const at::Tensor x = at::randn({1, 6, 32});
  EXPECT_TRUE(small_head_attention_fits(x, x, x, 8));   // 4 channels per head
  EXPECT_TRUE(small_head_attention_fits(x, x, x, 2));   // 16
  EXPECT_FALSE(small_head_attention_fits(x, x, x, 1));  // 32: the GEMM paths' work
  EXPECT_FALSE(small_head_attention_fits(x, x, x, 5));  // heads do not divide the channels
  EXPECT_FALSE(small_head_attention_fits(x.to(at::kDouble), x.to(at::kDouble), x.to(at::kDouble), 8));
  EXPECT_FALSE(small_head_attention_fits(x, x.to(at::kBFloat16), x, 8));  // mixed dtypes
  EXPECT_FALSE(small_head_attention_fits(x.view({6, 32}), x, x, 8));      // not [B, L, C]
  const std::string message = error_message([&] { small_head_attention(x, at::randn({1, 5, 32}), x, 8, 0.5, false); });
  EXPECT_NE(message.find("expected q [B, Lq, C], k and v [B, Lk, C]"), std::string::npos) << message;
  EXPECT_THROW(small_head_attention(x, x, at::randn({1, 6, 64}), 8, 0.5, false), Error);  // v wider than k
  EXPECT_NE(error_message([&] { small_head_attention(x, x, x, 1, 0.5, false); }).find("at most 16 channels"),
            std::string::npos);
}

// The Attention module takes the fused kernel for heads of up to 16 channels, and gives diffusers' numbers.
TEST(SmallHeadAttention, AttentionModuleTakesItForSmallHeadsOnly) {
  for (const int64_t dim_head : {4, 40}) {
    SCOPED_TRACE(dim_head);
    at::manual_seed(9);
    AttentionOptions o;
    o.query_dim = 32;
    o.heads = 8;
    o.dim_head = dim_head;
    o.cross_attention_dim = 24;
    Attention attention(o);
    const at::Tensor hidden = at::randn({2, 32, 4, 5}), context = at::randn({2, 7, 24});
    const at::Tensor out = attention->forward(hidden, context);
    EXPECT_EQ(graph_has_node(out, "SmallHeadAttention"), dim_head == 4);
    const at::Tensor h = hidden.flatten(2).transpose(1, 2);
    const at::Tensor heads_out =
        reference_attention(attention->to_q->forward(h), attention->to_k->forward(context),
                            attention->to_v->forward(context), 8, 1.0 / std::sqrt(dim_head), false);
    const at::Tensor expected =
        attention->to_out[0]->as<LinearImpl>()->forward(heads_out).transpose(1, 2).reshape({2, 32, 4, 5});
    EXPECT_TRUE(close_rel_max(out, expected, 1e-5));
  }
}

}  // namespace
}  // namespace sd::models
