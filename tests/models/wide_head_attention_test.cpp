#include "models/wide_head_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "core/cpu_features.h"
#include "model_test_util.h"
#include "models/diffusers_blocks.h"

namespace sd::models {
namespace {

// The attention kernels' test helpers (attention_test_util.h).
using namespace sd::test;
using Case = AttentionCase;
using Inputs = AttentionInputs;
using Grads = AttentionGrads;

// SD-1.5's heads of 40 over more queries than one block holds (blocks of 218 rows at 300 keys: one full, one short),
// a cross-attention against 77 keys, the VAE's single head of 512 channels, uneven small shapes, 4100 keys (blocks of
// the 64-row minimum, the last of 2 rows), and 32 keys (whole vectors, no masked tail in the softmax rows).
const std::vector<Case> kCases = {{1, 8, 300, 300, 40}, {2, 2, 70, 77, 24},    {1, 1, 64, 5, 512},
                                  {3, 2, 17, 9, 20},    {1, 1, 130, 4100, 24}, {2, 2, 40, 32, 24}};

TEST(WideHeadAttention, GradientsMatchFiniteDifferences) {
  for (const int bits : vector_widths()) {
    SCOPED_TRACE(::testing::Message() << bits << "-bit vectors");
    const VectorWidth width(bits);
    at::manual_seed(3);
    const Case c{2, 2, 7, 11, 17};
    expect_float32_gradients_match_finite_differences(
        [&](auto& q, auto& k, auto& v) { return wide_head_attention(q, k, v, c.heads, /*scale=*/0.3); },
        random_inputs(c));
  }
}

TEST(WideHeadAttention, EqualsDiffusersPathWhateverTheThreadsAndVectorWidth) {
  const int threads = at::get_num_threads();
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    at::manual_seed(c.lq + c.d);
    const Inputs in = random_inputs(c);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    const Grads reference =
        attention_grads([&](auto& q, auto& k, auto& v) { return reference_attention(q, k, v, c.heads, scale, false); },
                        in.q, in.k, in.v, in.weight);
    for (const int bits : vector_widths()) {
      const VectorWidth width(bits);
      for (int n : {1, 2, 3}) {
        at::set_num_threads(n);
        const Grads wide =
            attention_grads([&](auto& q, auto& k, auto& v) { return wide_head_attention(q, k, v, c.heads, scale); },
                            in.q, in.k, in.v, in.weight);
        // The same products in other summation orders (blocks, per-thread sums), a softmax with its own exp (within
        // 2 ulp): a few ulps of the largest.
        EXPECT_TRUE(grads_close(wide, reference, 1e-5)) << n << " threads, " << bits << "-bit vectors";
      }
    }
  }
  at::set_num_threads(threads);
}

// Inference keeps no probabilities and reuses one block buffer per thread; it computes every block as training does.
TEST(WideHeadAttention, InferenceGivesTrainingsOutputAndRunsRepeatBitForBit) {
  at::manual_seed(4);
  const Case c{2, 3, 300, 300, 24};
  const Inputs in = random_inputs(c);
  auto wide = [&](auto& q, auto& k, auto& v) { return wide_head_attention(q, k, v, c.heads, 0.2); };
  const Grads first = attention_grads(wide, in.q, in.k, in.v, in.weight),
              second = attention_grads(wide, in.q, in.k, in.v, in.weight);
  EXPECT_TRUE(at::equal(first.out, second.out));
  EXPECT_TRUE(at::equal(first.dq, second.dq));
  EXPECT_TRUE(at::equal(first.dk, second.dk));
  EXPECT_TRUE(at::equal(first.dv, second.dv));
  const at::Tensor without_grads = wide(in.q, in.k, in.v);  // grad mode on, but nothing to differentiate
  EXPECT_FALSE(without_grads.requires_grad());
  EXPECT_TRUE(at::equal(without_grads, first.out));
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(wide(in.q, in.k, in.v), first.out));
  // k as a non-contiguous view of the same numbers.
  const at::Tensor k_strided = in.k.transpose(0, 1).contiguous().transpose(0, 1);
  ASSERT_FALSE(k_strided.is_contiguous());
  EXPECT_TRUE(at::equal(wide(in.q, k_strided, in.v), first.out));
}

// The dtypes the kernel takes on this CPU: float32, and bf16 where the CPU runs bf16 in oneDNN.
std::vector<at::ScalarType> dtypes() {
  if (sd::cpu_runs_bf16_in_onednn()) return {at::kFloat, at::kBFloat16};
  return {at::kFloat};
}

// Memory-efficient training keeps each row's maximum and sum instead of the probabilities; backward recomputes them
// with forward's own operations, so every gradient equals the kept probabilities' to the bit, at every width, thread
// count and dtype (bf16 with its scores rounded or, under upcast_attention, not).
TEST(WideHeadAttention, RecomputedProbabilitiesGiveTheKeptOnesGradientsBitForBit) {
  const int threads = at::get_num_threads();
  for (const at::ScalarType dtype : dtypes()) {
    for (const bool upcast : {false, true}) {
      if (upcast && dtype == at::kFloat) continue;  // changes nothing in float32
      SCOPED_TRACE(::testing::Message() << dtype << (upcast ? ", upcast_attention" : ""));
      for (const Case& c : kCases) {
        SCOPED_TRACE(describe(c));
        at::manual_seed(c.lk + c.d);
        const Inputs in = random_inputs(c, dtype);
        const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
        for (const int bits : vector_widths()) {
          const VectorWidth width(bits);
          for (int n : {1, 2}) {
            at::set_num_threads(n);
            const auto grads_keeping = [&](bool keep) {
              return attention_grads(
                  [&](auto& q, auto& k, auto& v) { return wide_head_attention(q, k, v, c.heads, scale, upcast, keep); },
                  in.q, in.k, in.v, in.weight);
            };
            const Grads kept = grads_keeping(true), recomputed = grads_keeping(false);
            EXPECT_TRUE(at::equal(recomputed.out, kept.out)) << n << " threads, " << bits << "-bit vectors";
            EXPECT_TRUE(at::equal(recomputed.dq, kept.dq)) << n << " threads, " << bits << "-bit vectors";
            EXPECT_TRUE(at::equal(recomputed.dk, kept.dk)) << n << " threads, " << bits << "-bit vectors";
            EXPECT_TRUE(at::equal(recomputed.dv, kept.dv)) << n << " threads, " << bits << "-bit vectors";
          }
        }
      }
    }
  }
  at::set_num_threads(threads);
}

// bf16 rounds where diffusers' bf16 path rounds in the forward pass (scores unless upcast_attention, probabilities,
// output), so the outputs agree to a bf16 step or two (a score or probability near a rounding boundary can round the
// other way); backward keeps float32 but for the products' operands, so its gradients are at least as close to the
// float64 truth as the reference's.
TEST(WideHeadAttention, Bf16RoundsLikeDiffusersForwardAndBackwardIsNoWorse) {
  if (!sd::cpu_runs_bf16_in_onednn()) GTEST_SKIP() << "this CPU runs bf16 outside oneDNN";
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    at::manual_seed(c.lq + c.lk);
    const Inputs in = random_inputs(c, at::kBFloat16);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    for (const bool upcast : {false, true}) {
      SCOPED_TRACE(upcast ? "upcast_attention" : "bf16 scores");
      const auto reference = [&](auto& q, auto& k, auto& v) {
        return reference_attention(q, k, v, c.heads, scale, upcast);
      };
      const Grads truth = attention_grads(reference, in.q.to(at::kDouble), in.k.to(at::kDouble), in.v.to(at::kDouble),
                                          in.weight.to(at::kDouble));
      const Grads diffusers = attention_grads(reference, in.q, in.k, in.v, in.weight);
      for (const int bits : vector_widths()) {
        SCOPED_TRACE(::testing::Message() << bits << "-bit vectors");
        const VectorWidth width(bits);
        const Grads wide = attention_grads(
            [&](auto& q, auto& k, auto& v) { return wide_head_attention(q, k, v, c.heads, scale, upcast); }, in.q, in.k,
            in.v, in.weight);
        EXPECT_EQ(wide.out.scalar_type(), at::kBFloat16);
        EXPECT_EQ(wide.dq.scalar_type(), at::kBFloat16);
        EXPECT_EQ(wide.dk.scalar_type(), at::kBFloat16);
        EXPECT_TRUE(close_rel_max(wide.out, diffusers.out, 1.0 / 64));
        const std::pair<at::Tensor, at::Tensor> grads[] = {
            {wide.dq, diffusers.dq}, {wide.dk, diffusers.dk}, {wide.dv, diffusers.dv}};
        const at::Tensor true_grads[] = {truth.dq, truth.dk, truth.dv};
        for (size_t g = 0; g < 3; ++g)
          EXPECT_LE(rel_l2(grads[g].first, true_grads[g]), 1.05 * rel_l2(grads[g].second, true_grads[g]) + 1e-3)
              << "gradient " << g;
      }
    }
  }
}

// Training keeps up to 64 MiB of probabilities (SD-1.5's 32x32 self-attention at batch 1: 32 MiB) and recomputes
// larger ones (SD-2's 64x64 at 512²: 320 MiB).
TEST(WideHeadAttention, KeepsProbabilitiesOfUpTo64MiB) {
  const auto keeps = [](int64_t batch, int64_t heads, int64_t queries, int64_t keys) {
    return wide_head_attention_worth_keeping_probabilities(at::empty({batch, queries, heads * 40}),
                                                           at::empty({batch, keys, heads * 40}), heads);
  };
  EXPECT_TRUE(keeps(1, 8, 1024, 1024));
  EXPECT_FALSE(keeps(1, 5, 4096, 4096));
  EXPECT_TRUE(keeps(1, 4, 2048, 2048));   // 64 MiB exactly
  EXPECT_FALSE(keeps(1, 4, 2048, 2049));  // a key more
  EXPECT_FALSE(keeps(2, 4, 2048, 2048));  // the batch counts
  // bf16 probabilities take half the bytes.
  EXPECT_TRUE(wide_head_attention_worth_keeping_probabilities(at::empty({1, 2048, 160}, at::kBFloat16),
                                                              at::empty({1, 4096, 160}, at::kBFloat16), 4));
  EXPECT_FALSE(wide_head_attention_worth_keeping_probabilities(at::empty({1, 2048, 160}, at::kBFloat16),
                                                               at::empty({1, 4097, 160}, at::kBFloat16), 4));
}

// A NaN reaches the outputs it touches, as in the reference, so a diverging run is noticed rather than hidden.
TEST(WideHeadAttention, NanReachesTheRowsItTouches) {
  for (const at::ScalarType dtype : dtypes()) {
    SCOPED_TRACE(::testing::Message() << dtype);
    at::manual_seed(2);
    const Case c{1, 2, 6, 9, 20};
    const Inputs in = random_inputs(c, dtype);
    at::Tensor q = in.q.clone();
    q[0][3][1] = NAN;  // query 3 of head 0
    for (const int bits : vector_widths()) {
      const VectorWidth width(bits);
      const at::Tensor out = wide_head_attention(q, in.k, in.v, c.heads, 0.5);
      EXPECT_TRUE(at::equal(out.isnan().any(-1)[0], at::arange(6).eq(3))) << bits << "-bit vectors";
      EXPECT_TRUE(out[0][3].slice(0, 0, 20).isnan().all().item<bool>());    // head 0's channels
      EXPECT_FALSE(out[0][3].slice(0, 20, 40).isnan().any().item<bool>());  // head 1's
    }
  }
}

TEST(WideHeadAttention, FitsOnlyWhatItComputes) {
  const at::Tensor x = at::randn({1, 6, 80});
  EXPECT_TRUE(wide_head_attention_fits(x, x, x, 2));   // 40 channels per head
  EXPECT_TRUE(wide_head_attention_fits(x, x, x, 4));   // 20
  EXPECT_FALSE(wide_head_attention_fits(x, x, x, 5));  // 16: the small-head kernel's work
  EXPECT_FALSE(wide_head_attention_fits(x, x, x, 3));  // heads do not divide the channels
  EXPECT_EQ(wide_head_attention_fits(x.to(at::kBFloat16), x.to(at::kBFloat16), x.to(at::kBFloat16), 2),
            sd::cpu_runs_bf16_in_onednn());
  EXPECT_FALSE(wide_head_attention_fits(x, x.to(at::kBFloat16), x, 2));  // mixed dtypes
  EXPECT_FALSE(wide_head_attention_fits(x.to(at::kDouble), x.to(at::kDouble), x.to(at::kDouble), 2));
  EXPECT_FALSE(wide_head_attention_fits(x.view({6, 80}), x, x, 2));                            // not [B, L, C]
  EXPECT_FALSE(wide_head_attention_fits(x, at::randn({2, 6, 80}), at::randn({2, 6, 80}), 2));  // batch sizes differ
  EXPECT_FALSE(wide_head_attention_fits(x, x, at::randn({1, 5, 80}), 2));                      // v's keys differ
  EXPECT_FALSE(wide_head_attention_fits(x, at::randn({1, 0, 80}), at::randn({1, 0, 80}), 2));  // no keys
  EXPECT_FALSE(wide_head_attention_fits(at::randn({1, 0, 80}), x, x, 2));                      // no queries
  const std::string message = error_message([&] {
    wide_head_attention(x, at::randn({1, 5, 40}), at::randn({1, 5, 40}), 2, 0.5);
  });
  EXPECT_NE(message.find("expected float32 (or, on a CPU that runs bf16 in oneDNN, bf16) q [B, Lq, heads*d], k and v "
                         "[B, Lk, heads*d] of one dtype with 2 heads of more than 16 channels on a CPU with AVX2 and "
                         "FMA, got Float [1, 6, 80], Float [1, 5, 40], Float [1, 5, 40]"),
            std::string::npos)
      << message;
}

// The Attention module takes the kernel for heads of more than 16 channels, keeping the probabilities or, under
// --enable_xformers_memory_efficient_attention, recomputing them; either way it gives diffusers' numbers (to float32
// rounding, or to a bf16 step or two). Which one it takes changes no digit:
// RecomputedProbabilitiesGiveTheKeptOnesGradientsBitForBit.
TEST(WideHeadAttention, AttentionModuleTakesItWhetherMemoryEfficientOrNot) {
  for (const at::ScalarType dtype : dtypes()) {
    for (const bool memory_efficient : {false, true}) {
      SCOPED_TRACE(::testing::Message() << dtype << (memory_efficient ? ", memory-efficient" : ", plain"));
      at::manual_seed(9);
      AttentionOptions o;
      o.query_dim = 32;
      o.heads = 2;
      o.dim_head = 40;
      o.cross_attention_dim = 24;
      Attention attention(o);
      attention->to(dtype);
      attention->set_memory_efficient(memory_efficient);
      const at::Tensor hidden = at::randn({2, 32, 4, 5}).to(dtype), context = at::randn({2, 7, 24}).to(dtype);
      const at::Tensor out = attention->forward(hidden, context);
      EXPECT_TRUE(graph_has_node(out, "WideHeadAttention"));
      EXPECT_FALSE(graph_has_node(out, "TiledAttention"));
      const at::Tensor h = hidden.flatten(2).transpose(1, 2);
      const at::Tensor heads_out =
          reference_attention(attention->to_q->forward(h), attention->to_k->forward(context),
                              attention->to_v->forward(context), 2, 1.0 / std::sqrt(40.0), false);
      const at::Tensor expected =
          attention->to_out[0]->as<LinearImpl>()->forward(heads_out).transpose(1, 2).reshape({2, 32, 4, 5});
      const double tolerance = dtype == at::kFloat ? 1e-5 : 1.0 / 64;
      EXPECT_TRUE(close_rel_max(out, expected, tolerance));
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(close_rel_max(attention->forward(hidden, context), expected, tolerance));
    }
  }
}

}  // namespace
}  // namespace sd::models
