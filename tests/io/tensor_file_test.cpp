#include "io/tensor_file.h"

#include <gtest/gtest.h>

#include <limits>

#include "core/error.h"

namespace sd::io {
namespace {

double largest_finite(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble: return std::numeric_limits<double>::max();
    case at::kBFloat16: return 3.3895313892515355e38;  // 0x7f7f
    case at::kHalf: return 65504.0;
    default: return std::numeric_limits<float>::max();
  }
}

// More than one parallel chunk (2^16 values), with specials at both ends, at the chunks' seam and in the last,
// partial chunk; and finite values near the specials in bits: the largest finite, -0, and float32's smallest denormal
// (a denormal in float32 and float64, 0 once rounded to bf16 or float16).
at::Tensor values_with_specials(at::ScalarType dtype) {
  const int64_t n = 3 * (int64_t{1} << 16) + 5;
  at::Tensor t = at::linspace(-3, 3, n, at::kDouble);
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (auto [index, value] : {std::pair<int64_t, double>{0, nan}, {1, -inf}, {65535, inf}, {65536, nan}, {n - 1, inf}})
    t[index] = value;
  t = t.to(dtype);
  t[2] = at::Scalar(-0.0);
  t[3] = std::numeric_limits<float>::denorm_min();
  t[4] = largest_finite(dtype);
  return t;
}

TEST(CountNonfinite, CountsNansAndInfinitiesOfEveryFloatingType) {
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    const at::Tensor t = values_with_specials(dtype);
    ASSERT_EQ(t.scalar_type(), dtype);
    EXPECT_EQ(count_nonfinite(t), 5) << c10::toString(dtype);
    EXPECT_EQ(count_nonfinite(t), t.numel() - at::isfinite(t).sum().item<int64_t>()) << c10::toString(dtype);
    EXPECT_EQ(count_nonfinite(t.narrow(0, 2, 65533)), 0) << c10::toString(dtype);  // the finite run between them
  }
}

TEST(CountNonfinite, ReadsStridedViewsAndIgnoresIntegers) {
  at::Tensor t = at::zeros({300, 400});
  t.index_put_({7, 9}, std::numeric_limits<float>::quiet_NaN());
  t.index_put_({299, 0}, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(count_nonfinite(t.t()), 2);
  EXPECT_EQ(count_nonfinite(t.narrow(1, 1, 10)), 1);
  EXPECT_EQ(count_nonfinite(at::full({70000}, 0x7f800000, at::kInt)), 0);
  EXPECT_EQ(count_nonfinite(at::empty({0})), 0);
}

TEST(CheckFinite, NamesTheFileTheTensorAndTheCount) {
  at::Tensor t = at::ones({4, 4}, at::kBFloat16);
  check_finite(t, "unet.safetensors", "conv.weight");
  t[1][2] = std::numeric_limits<float>::infinity();
  try {
    check_finite(t, "unet.safetensors", "conv.weight");
    FAIL() << "expected an error";
  } catch (const sd::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("unet.safetensors: tensor 'conv.weight' holds 1 NaN or infinite values (of 16)"),
        std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace sd::io
