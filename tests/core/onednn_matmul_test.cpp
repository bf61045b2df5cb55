#include "core/onednn_matmul.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/cpu_features.h"
#include "models/model_test_util.h"

namespace sd {
namespace {

at::Tensor random_bf16(at::IntArrayRef sizes, bool transposed) {
  if (!transposed) return at::randn(sizes).to(at::kBFloat16);
  return at::randn({sizes[1], sizes[0]}).to(at::kBFloat16).t();
}

struct Case {
  int64_t m, k, n;
  bool a_transposed, b_transposed, bias;
};

class OnednnMatmulTest : public ::testing::TestWithParam<Case> {};

// The same oneDNN arithmetic as at::mm / at::addmm: the products must agree to the bit, whatever the layouts.
TEST_P(OnednnMatmulTest, MatchesAtenBitForBit) {
  if (!cpu_runs_bf16_in_onednn()) GTEST_SKIP() << "this CPU runs bf16 outside oneDNN";
  const Case c = GetParam();
  at::manual_seed(c.m * 131 + c.k * 7 + c.n);
  const at::Tensor a = random_bf16({c.m, c.k}, c.a_transposed), b = random_bf16({c.k, c.n}, c.b_transposed);
  const at::Tensor bias = c.bias ? at::randn({c.n}).to(at::kBFloat16) : at::Tensor();
  const at::Tensor weight = b.t();  // [N, K], as a linear layer holds it
  ASSERT_TRUE(onednn_matmul_fits(a, b));
  ASSERT_TRUE(onednn_linear_fits(a, weight));
  const at::Tensor expected = c.bias ? at::addmm(bias, a, b) : at::mm(a, b);
  PackedMatrix packed_b;
  for (int repeat = 0; repeat < 2; ++repeat) {  // the second call runs the kept primitive (and packed b)
    for (const at::Tensor& got : {onednn_matmul(a, b, bias), onednn_linear(a, weight, bias)}) {
      EXPECT_EQ(got.sizes(), (at::IntArrayRef{c.m, c.n}));
      EXPECT_TRUE(got.is_contiguous());
      EXPECT_TRUE(at::equal(got, expected));
    }
    const at::Tensor got = packed_b.times(a, b);
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_TRUE(at::equal(got, at::mm(a, b)));
    // A bias down the columns (a GEMM convolution's), as at::addmm broadcasts a [M, 1] one (whose bits for a single
    // column depend on a's layout).
    const at::Tensor column_bias = at::randn({c.m}).to(at::kBFloat16);
    const at::Tensor got_column = onednn_addmm(column_bias, a, b);
    EXPECT_TRUE(got_column.is_contiguous());
    if (c.n > 1) {
      EXPECT_TRUE(at::equal(got_column, at::addmm(column_bias.unsqueeze(1), a, b)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, OnednnMatmulTest,
                         ::testing::Values(Case{512, 64, 64, false, true, true}, Case{512, 64, 64, false, false, false},
                                           Case{64, 512, 96, true, false, false}, Case{33, 17, 8, true, true, true},
                                           Case{1, 32, 129, false, true, true}, Case{2048, 1, 3, false, false, true},
                                           Case{200, 24, 1, true, false, false},
                                           // SD-1.5's GEMM convolutions on 4x4 maps have this form: long K, few columns
                                           Case{640, 5760, 16, false, false, true}));

TEST(OnednnMatmul, NamesAColumnBiasOfTheWrongSize) {
  const at::Tensor a = at::randn({64, 16}).to(at::kBFloat16), b = at::randn({16, 8}).to(at::kBFloat16);
  try {
    onednn_addmm(at::zeros({8}, at::kBFloat16), a, b);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_STREQ(e.what(), "onednn_addmm: expected a bias of 64 values, got [8]");
  }
}

TEST(OnednnMatmul, KeepsTwoShapesApart) {
  if (!cpu_runs_bf16_in_onednn()) GTEST_SKIP() << "this CPU runs bf16 outside oneDNN";
  const at::Tensor a = at::randn({64, 16}).to(at::kBFloat16), b = at::randn({16, 8}).to(at::kBFloat16);
  const at::Tensor a2 = at::randn({65, 16}).to(at::kBFloat16);
  EXPECT_TRUE(at::equal(onednn_matmul(a, b), at::mm(a, b)));
  EXPECT_TRUE(at::equal(onednn_matmul(a2, b), at::mm(a2, b)));
  EXPECT_TRUE(at::equal(onednn_matmul(a, b), at::mm(a, b)));
}

TEST(OnednnMatmul, TakesOnlyBf16MatricesWithAUnitStride) {
  const at::Tensor a = at::randn({64, 16}).to(at::kBFloat16), b = at::randn({16, 8}).to(at::kBFloat16);
  EXPECT_EQ(onednn_matmul_fits(a, b), cpu_runs_bf16_in_onednn());
  EXPECT_FALSE(onednn_matmul_fits(a.to(at::kFloat), b.to(at::kFloat)));
  EXPECT_FALSE(onednn_matmul_fits(a, b.t()));                          // 64x16 by 8x16
  EXPECT_EQ(onednn_linear_fits(a, b.t()), cpu_runs_bf16_in_onednn());  // 64x16 by (8x16)ᵀ
  EXPECT_FALSE(onednn_linear_fits(a, b));                              // 64x16 by (16x8)ᵀ
  EXPECT_FALSE(onednn_linear_fits(a, b.t().unsqueeze(0)));
  EXPECT_FALSE(onednn_matmul_fits(at::randn({64, 32}).to(at::kBFloat16).slice(1, 0, 32, 2), b));  // stride 2
  EXPECT_FALSE(onednn_matmul_fits(a.unsqueeze(0), b));
  EXPECT_FALSE(onednn_matmul_fits(a.slice(0, 0, 0), b));
}

// at::mm keeps products of up to 16³ multiply-adds in LibTorch's own kernel, and so does onednn_matmul_fits.
TEST(OnednnMatmul, LeavesAtenItsSmallProducts) {
  const at::Tensor a = at::randn({16, 16}).to(at::kBFloat16);
  EXPECT_FALSE(onednn_matmul_fits(a, at::randn({16, 16}).to(at::kBFloat16)));
  EXPECT_EQ(onednn_matmul_fits(a, at::randn({16, 17}).to(at::kBFloat16)), cpu_runs_bf16_in_onednn());
}

// The packed copy follows its matrix: written in place, replaced, laid out anew; and serves a's of any row count.
TEST(PackedMatrix, RepacksWhenItsMatrixChanges) {
  if (!cpu_runs_bf16_in_onednn()) GTEST_SKIP() << "this CPU runs bf16 outside oneDNN";
  at::manual_seed(3);
  at::Tensor b = at::randn({64, 48}).to(at::kBFloat16);
  const at::Tensor a = at::randn({16, 64}).to(at::kBFloat16), taller = at::randn({40, 64}).to(at::kBFloat16);
  PackedMatrix packed;
  EXPECT_EQ(packed.bytes(), 0);
  EXPECT_TRUE(at::equal(packed.times(a, b), at::mm(a, b)));
  EXPECT_GE(packed.bytes(), b.nbytes());
  EXPECT_TRUE(at::equal(packed.times(taller, b), at::mm(taller, b)));
  b.mul_(-3);  // in place: a new version
  EXPECT_TRUE(at::equal(packed.times(a, b), at::mm(a, b)));
  b.set_data(at::randn({64, 48}).to(at::kBFloat16));  // new storage
  EXPECT_TRUE(at::equal(packed.times(a, b), at::mm(a, b)));
  const at::Tensor column_major = at::randn({48, 64}).to(at::kBFloat16).t();
  EXPECT_TRUE(at::equal(packed.times(a, column_major), at::mm(a, column_major)));
  const at::Tensor square = at::randn({64, 64}).to(at::kBFloat16);  // its transpose: same storage, other strides
  EXPECT_TRUE(at::equal(packed.times(a, square), at::mm(a, square)));
  EXPECT_TRUE(at::equal(packed.times(a, square.t()), at::mm(a, square.t())));
  const at::Tensor storage = at::randn({2, 64, 48}).to(at::kBFloat16);  // same storage, another offset
  EXPECT_TRUE(at::equal(packed.times(a, storage[0]), at::mm(a, storage[0])));
  EXPECT_TRUE(at::equal(packed.times(a, storage[1]), at::mm(a, storage[1])));
}

// The products per sample are each sample's own product, to the bit: onednn_addmm_per_sample's w·b[s] + bias (b's
// samples row-major, as a convolution's patch columns, or column-major) and PackedMatrix::times' a[s]·b (a's samples
// column-major, as the transposed maps' gradients the backward of a frozen convolution multiplies).
TEST(OnednnMatmul, ProductsPerSampleAreEachSamplesProduct) {
  if (!cpu_runs_bf16_in_onednn()) GTEST_SKIP() << "this CPU runs bf16 outside oneDNN";
  at::manual_seed(9);
  const at::Tensor w = at::randn({48, 72}).to(at::kBFloat16), bias = at::randn({48}).to(at::kBFloat16);
  const at::Tensor columns = at::randn({3, 72, 20}).to(at::kBFloat16),
                   column_major = at::randn({3, 20, 72}).to(at::kBFloat16).transpose(1, 2);
  for (const at::Tensor& b : {columns, column_major}) {
    ASSERT_TRUE(onednn_per_sample_fits(w, b));
    const at::Tensor with_bias = onednn_addmm_per_sample(bias, w, b), without = onednn_addmm_per_sample({}, w, b);
    ASSERT_EQ(with_bias.sizes(), (at::IntArrayRef{3, 48, 20}));
    for (int64_t s = 0; s < 3; ++s) {
      EXPECT_TRUE(at::equal(with_bias[s], onednn_addmm(bias, w, b[s])));
      EXPECT_TRUE(at::equal(without[s], onednn_matmul(w, b[s])));
    }
  }
  const at::Tensor maps_gradient = at::randn({3, 48, 20}).to(at::kBFloat16).transpose(1, 2);  // [3, 20, 48]
  ASSERT_TRUE(onednn_per_sample_fits(maps_gradient, w));
  PackedMatrix packed;
  const at::Tensor got = packed.times(maps_gradient, w);
  ASSERT_EQ(got.sizes(), (at::IntArrayRef{3, 20, 72}));
  for (int64_t s = 0; s < 3; ++s) EXPECT_TRUE(at::equal(got[s], at::mm(maps_gradient[s], w)));
  EXPECT_FALSE(onednn_per_sample_fits(w, columns.slice(2, 0, 1)));  // one column
  EXPECT_FALSE(onednn_per_sample_fits(w, columns[0]));              // two matrices
  EXPECT_FALSE(onednn_per_sample_fits(w, columns.to(at::kFloat)));
}

// A row-major matrix of `rows` x `cols` bf16 values stored with `pad` more values per row, and op(X) of it.
struct Stored {
  at::Tensor storage, op;
  int64_t ld;
};
Stored stored_bf16(int64_t rows, int64_t cols, char trans, int64_t pad) {
  // op(X) is rows x cols: stored as it is ('N') or as its transpose ('T').
  const int64_t stored_rows = trans == 'N' ? rows : cols, stored_cols = trans == 'N' ? cols : rows;
  const at::Tensor storage = at::randn({stored_rows, stored_cols + pad}).to(at::kBFloat16);
  const at::Tensor x = storage.slice(1, 0, stored_cols);
  return {storage, trans == 'N' ? x : x.t(), stored_cols + pad};
}

// gemm_bf16 takes dnnl_sgemm's row-major arguments (op 'N' or 'T', leading dimensions wider than the rows), scales
// the product, and writes float32 (or adds to it) or bf16, leaving the columns past n alone. The float32 sums of the
// bf16 values' exact products: within float32 rounding of the float64 product, and bf16 within half a bf16 step.
TEST(GemmBf16, TakesSgemmsArgumentsIntoFloat32OrBf16) {
  if (!cpu_runs_bf16_in_onednn()) GTEST_SKIP() << "this CPU runs bf16 outside oneDNN";
  const int64_t m = 37, n = 21, k = 45, ldc = n + 2;
  for (const char trans_a : {'N', 'T'}) {
    for (const char trans_b : {'N', 'T'}) {
      SCOPED_TRACE(::testing::Message() << "op(A) " << trans_a << ", op(B) " << trans_b);
      at::manual_seed(trans_a * 3 + trans_b);
      const Stored a = stored_bf16(m, k, trans_a, 3), b = stored_bf16(k, n, trans_b, 5);
      const at::Tensor expected = at::mm(a.op.to(at::kDouble), b.op.to(at::kDouble)) * 0.5;
      const auto call = [&](auto* c, float beta) {
        gemm_bf16(trans_a, trans_b, m, n, k, 0.5f, a.storage.data_ptr<c10::BFloat16>(), a.ld,
                  b.storage.data_ptr<c10::BFloat16>(), b.ld, beta, c, ldc);
      };
      for (int repeat = 0; repeat < 2; ++repeat) {  // the second call runs the kept primitive
        at::Tensor c = at::full({m, ldc}, 7.f);
        call(c.data_ptr<float>(), 0.f);
        EXPECT_LT((c.slice(1, 0, n) - expected).abs().max().item<double>(), 1e-5 * expected.abs().max().item<double>());
        EXPECT_TRUE(c.slice(1, n).eq(7.f).all().item<bool>());
        const at::Tensor once = c.clone();
        call(c.data_ptr<float>(), 1.f);
        EXPECT_TRUE(at::allclose(c.slice(1, 0, n), 2 * once.slice(1, 0, n), 1e-6, 1e-6));
        at::Tensor c_bf16 = at::full({m, ldc}, 7.f).to(at::kBFloat16);
        gemm_bf16(trans_a, trans_b, m, n, k, 0.5f, a.storage.data_ptr<c10::BFloat16>(), a.ld,
                  b.storage.data_ptr<c10::BFloat16>(), b.ld, c_bf16.data_ptr<c10::BFloat16>(), ldc);
        const at::Tensor rounded = c_bf16.slice(1, 0, n).to(at::kDouble);
        EXPECT_TRUE(((rounded - expected).abs() <= expected.abs() * (1.0 / 256) + 1e-30).all().item<bool>());
        EXPECT_TRUE(c_bf16.slice(1, n).to(at::kFloat).eq(7.f).all().item<bool>());
      }
    }
  }
}

TEST(GemmBf16, AddsToFloat32OutputsOnly) {
  if (!cpu_runs_bf16_in_onednn()) GTEST_SKIP() << "this CPU runs bf16 outside oneDNN";
  const at::Tensor a = at::randn({4, 4}).to(at::kBFloat16);
  at::Tensor c = at::zeros({4, 4});
  const std::string message = test::error_message([&] {
    gemm_bf16('N', 'N', 4, 4, 4, 1.f, a.data_ptr<c10::BFloat16>(), 4, a.data_ptr<c10::BFloat16>(), 4, 0.5f,
              c.data_ptr<float>(), 4);
  });
  EXPECT_NE(message.find("gemm_bf16: beta must be 0 or 1, got 0.5"), std::string::npos) << message;
}

}  // namespace
}  // namespace sd
