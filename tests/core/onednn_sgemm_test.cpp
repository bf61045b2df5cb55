#include "core/onednn_sgemm.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace sd {
namespace {

// A [rows, cols] float32 matrix, row-major or a transposed view of a row-major one (column-major).
at::Tensor random_matrix(int64_t rows, int64_t cols, bool transposed) {
  return transposed ? at::randn({cols, rows}).t() : at::randn({rows, cols});
}

struct Case {
  int64_t m, k, n;
  bool a_transposed, b_transposed;
};

class Float32MatmulTest : public ::testing::TestWithParam<Case> {};

// The same sgemm_ call as at::mm / at::addmm makes: the products must agree to the bit, whatever the layouts.
TEST_P(Float32MatmulTest, MatchesAtenBitForBit) {
  const Case c = GetParam();
  at::manual_seed(c.m * 131 + c.k * 7 + c.n);
  const at::Tensor a = random_matrix(c.m, c.k, c.a_transposed), b = random_matrix(c.k, c.n, c.b_transposed);
  ASSERT_TRUE(float32_matmul_fits(a, b));
  const at::Tensor product = float32_matmul(a, b);
  EXPECT_EQ(product.sizes(), (at::IntArrayRef{c.m, c.n}));
  EXPECT_TRUE(product.is_contiguous());
  EXPECT_TRUE(at::equal(product, at::mm(a, b)));

  const at::Tensor weight = b.t();  // [N, K], as a linear layer holds it
  const at::Tensor bias = at::randn({c.n});
  ASSERT_TRUE(float32_linear_fits(a, weight, bias));
  EXPECT_TRUE(at::equal(float32_linear(a, weight), at::mm(a, weight.t())));
  const at::Tensor with_bias = float32_linear(a, weight, bias);
  EXPECT_TRUE(with_bias.is_contiguous());
  EXPECT_TRUE(at::equal(with_bias, at::addmm(bias, a, weight.t())));
  EXPECT_TRUE(at::equal(with_bias, at::linear(a, weight, bias)));
}

INSTANTIATE_TEST_SUITE_P(Layouts, Float32MatmulTest,
                         ::testing::Values(Case{512, 64, 64, false, true}, Case{512, 64, 64, false, false},
                                           Case{64, 512, 96, true, false}, Case{33, 17, 8, true, true},
                                           Case{2, 320, 1280, false, true}, Case{4096, 40, 4096, false, false},
                                           Case{77, 768, 320, false, true}));

// A row-major slice of a wider matrix (a row stride above its width) is read in place, as BLAS's leading dimension
// allows.
TEST(Float32Matmul, ReadsSlicesOfWiderMatricesInPlace) {
  at::manual_seed(3);
  const at::Tensor wide = at::randn({48, 100});
  const at::Tensor a = wide.narrow(1, 10, 32), b = at::randn({40, 32}).t();
  ASSERT_TRUE(float32_matmul_fits(a, b));
  EXPECT_TRUE(at::equal(float32_matmul(a, b), at::mm(a, b)));
}

// A GEMM convolution's weight [Cout, Cin·kh·kw] times each image's columns [Cin·kh·kw, H'·W'], plus the bias down
// the columns: each sample as at::addmm makes it alone, whether the batch is contiguous or a view of one.
TEST(Float32Matmul, ProductsPerSampleAreEachSamplesProduct) {
  at::manual_seed(5);
  const at::Tensor w = at::randn({64, 288}), bias = at::randn({64});
  const at::Tensor contiguous = at::randn({3, 288, 64}), strided = at::randn({3, 64, 288}).transpose(1, 2);
  for (const at::Tensor& columns : {contiguous, strided}) {
    ASSERT_TRUE(float32_per_sample_fits(w, columns));
    const at::Tensor with_bias = float32_addmm_per_sample(bias, w, columns);
    const at::Tensor without = float32_addmm_per_sample(at::Tensor(), w, columns);
    EXPECT_EQ(with_bias.sizes(), (at::IntArrayRef{3, 64, 64}));
    for (int64_t s = 0; s < 3; ++s) {
      EXPECT_TRUE(at::equal(with_bias[s], at::addmm(bias.unsqueeze(1), w, columns[s]))) << "sample " << s;
      EXPECT_TRUE(at::equal(without[s], at::mm(w, columns[s]))) << "sample " << s;
    }
  }
}

TEST(Float32Matmul, NamesAPerSampleBiasOfTheWrongSize) {
  const at::Tensor w = at::randn({8, 4}), columns = at::randn({2, 4, 6});
  try {
    float32_addmm_per_sample(at::randn({6}), w, columns);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("expected a contiguous float32 bias of 8 values, got [6]"), std::string::npos)
        << e.what();
  }
}

TEST(Float32Matmul, LeavesAtenWhatItDoesNotTake) {
  const at::Tensor a = at::randn({8, 4}), b = at::randn({4, 6});
  EXPECT_FALSE(float32_matmul_fits(a.to(at::kDouble), b.to(at::kDouble)));
  EXPECT_FALSE(float32_matmul_fits(a.to(at::kBFloat16), b));
  EXPECT_FALSE(float32_matmul_fits(a, at::randn({5, 6})));                      // inner sizes differ
  EXPECT_FALSE(float32_matmul_fits(a.unsqueeze(0), b));                         // not 2-D
  EXPECT_FALSE(float32_matmul_fits(at::randn({1, 4}), b));                      // a size-one dimension
  EXPECT_FALSE(float32_matmul_fits(a, at::randn({4, 12}).slice(1, 0, 12, 2)));  // neither dimension unit-stride
  const at::Tensor weight = b.t();
  EXPECT_TRUE(float32_linear_fits(a, weight, at::Tensor()));
  EXPECT_FALSE(float32_linear_fits(a, weight, at::randn({5})));                      // bias of the wrong size
  EXPECT_FALSE(float32_linear_fits(a, weight, at::randn({6}).to(at::kDouble)));      // bias of another dtype
  EXPECT_FALSE(float32_linear_fits(a, weight, at::randn({12}).slice(0, 0, 12, 2)));  // strided bias
  EXPECT_TRUE(float32_per_sample_fits(a, at::randn({2, 4, 6})));
  EXPECT_FALSE(float32_per_sample_fits(a, at::randn({2, 5, 6})));  // inner sizes differ
  EXPECT_FALSE(float32_per_sample_fits(a, at::randn({0, 4, 6})));  // no samples
  EXPECT_FALSE(float32_per_sample_fits(a, at::randn({4, 6})));     // not a batch
}

}  // namespace
}  // namespace sd
