#include "train/gradient_norm.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "test_util.h"

namespace sd::train {
namespace {

double reference(const at::Tensor& g) {
  const double norm = at::norm(g.to(at::kFloat), 2).item<double>();
  return norm * norm;
}

double exact(const at::Tensor& g) { return g.to(at::kDouble).pow(2).sum().item<double>(); }

TEST(GradientNorm, Float32IsLibTorchsNormSquared) {
  const at::Tensor g = at::randn({100003});
  EXPECT_EQ(squared_l2_norm(g), reference(g));
}

// Sizes: shorter than one vector, one chunk with a tail of each width's loop, several chunks spread over the
// threads with a tail.
TEST(GradientNorm, Bf16IsTheExactNormOfItsValuesAndLibTorchsWithinItsRounding) {
  for (const int bits : test::vector_widths()) {
    const test::VectorWidth width(bits);
    at::manual_seed(0);
    for (const int64_t n : {int64_t{5}, int64_t{1000}, int64_t{1015}, (int64_t{5} << 16) + 3}) {
      const at::Tensor g = (at::randn({n}) * 1e-3).to(at::kBFloat16);
      EXPECT_NEAR(squared_l2_norm(g), exact(g), 1e-12 * exact(g)) << n << " values, " << bits << " bits";
      // LibTorch's float32 norm itself strays from the exact value (2.5e-5 of the square at 327,683 values).
      EXPECT_NEAR(squared_l2_norm(g), reference(g), 1e-4 * reference(g)) << n << " values, " << bits << " bits";
    }
    EXPECT_EQ(squared_l2_norm(at::zeros({17}, at::kBFloat16)), 0.0);
    // Squared in float64: a value whose square is past float32's range still counts.
    const at::Tensor large = at::full({40}, 1e20, at::kFloat).to(at::kBFloat16);
    EXPECT_NEAR(squared_l2_norm(large), exact(large), 1e-12 * exact(large)) << bits << " bits";
  }
}

TEST(GradientNorm, Bf16PiecesAreReadFromTheirOffset) {
  const at::Tensor g = at::arange(40, at::kFloat).to(at::kBFloat16);
  EXPECT_EQ(squared_l2_norm(g.narrow(0, 30, 3)), 30.0 * 30 + 31 * 31 + 32 * 32);
}

TEST(GradientNorm, AnInfiniteOrNanGradientShows) {
  for (const int bits : test::vector_widths()) {
    const test::VectorWidth width(bits);
    at::Tensor g = at::ones({64}, at::kBFloat16);
    g[9] = std::numeric_limits<float>::infinity();
    EXPECT_TRUE(std::isinf(squared_l2_norm(g))) << bits << " bits";
    g[9] = std::nan("");
    EXPECT_TRUE(std::isnan(squared_l2_norm(g))) << bits << " bits";
  }
}

// Threads take whole pieces, so each float32 piece keeps LibTorch's digits and the total is their sum in order,
// whatever the thread count; empty pieces and pieces of very different sizes included.
TEST(GradientNorm, PiecesAreSummedInOrderWithEachPiecesOwnDigits) {
  at::manual_seed(1);
  const std::vector<at::Tensor> pieces = {at::randn({300000}),
                                          at::randn({0}),
                                          at::randn({7}),
                                          at::randn({200001}),
                                          (at::randn({70000}) * 1e-2).to(at::kBFloat16),
                                          at::randn({0})};
  double in_order = 0;
  for (const auto& p : pieces) in_order += p.numel() > 0 ? squared_l2_norm(p) : 0.0;
  for (const int threads : {1, 2, 3}) {
    const int saved = at::get_num_threads();
    at::set_num_threads(threads);
    const double total = sum_of_squared_l2_norms(pieces);
    at::set_num_threads(saved);
    EXPECT_EQ(total, in_order) << threads << " threads";
  }
  EXPECT_EQ(sum_of_squared_l2_norms({}), 0.0);
}

}  // namespace
}  // namespace sd::train
