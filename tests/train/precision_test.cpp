#include "train/precision.h"

#include <gtest/gtest.h>

#include "core/cpu_features.h"
#include "test_util.h"

namespace sd::train {
namespace {

TEST(PrecisionPolicy, NoIsFloat32Everywhere) {
  const PrecisionPolicy p = PrecisionPolicy::from_flag("no");
  EXPECT_EQ(p.compute, at::kFloat);
  EXPECT_EQ(p.frozen, at::kFloat);
  EXPECT_EQ(p.master, at::kFloat);
  EXPECT_FALSE(p.mixed());
}

// bf16 (and fp16, taken as bf16) computes in bf16 only where that is faster than float32; master weights stay float32.
TEST(PrecisionPolicy, Bf16ComputesInBf16OnlyWhereItIsFast) {
  const at::ScalarType expected = cpu_has_fast_bf16() ? at::kBFloat16 : at::kFloat;
  for (const char* flag : {"bf16", "fp16"}) {
    const PrecisionPolicy p = PrecisionPolicy::from_flag(flag);
    EXPECT_EQ(p.compute, expected) << flag;
    EXPECT_EQ(p.frozen, expected) << flag;
    EXPECT_EQ(p.master, at::kFloat) << flag;
    EXPECT_EQ(p.mixed(), cpu_has_fast_bf16()) << flag;
  }
}

TEST(PrecisionPolicy, AnUnknownFlagIsNamed) {
  EXPECT_EQ(test::error_of([] { PrecisionPolicy::from_flag("fp8"); }),
            "--mixed_precision: expected no, fp16 or bf16, got 'fp8'");
}

}  // namespace
}  // namespace sd::train
