#include "train/precision.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "core/cpu_features.h"
#include "test_util.h"

namespace sd::train {
namespace {

using test::ScopedEnv;

TEST(PrecisionPolicy, NoIsFloat32Everywhere) {
  const PrecisionPolicy p = PrecisionPolicy::from_flag("no");
  EXPECT_EQ(p.compute, at::kFloat);
  EXPECT_EQ(p.frozen, at::kFloat);
  EXPECT_EQ(p.master, at::kFloat);
  EXPECT_FALSE(p.mixed());
}

// bf16 (and fp16, taken as bf16) computes in bf16 only where that is faster than float32; master weights stay float32.
TEST(PrecisionPolicy, Bf16ComputesInBf16OnlyWhereItIsFast) {
  const ScopedEnv unforced("SDTRAIN_FORCE_BF16", std::nullopt);
  const at::ScalarType expected = cpu_has_fast_bf16() ? at::kBFloat16 : at::kFloat;
  for (const char* flag : {"bf16", "fp16"}) {
    const PrecisionPolicy p = PrecisionPolicy::from_flag(flag);
    EXPECT_EQ(p.compute, expected) << flag;
    EXPECT_EQ(p.frozen, expected) << flag;
    EXPECT_EQ(p.master, at::kFloat) << flag;
    EXPECT_EQ(p.mixed(), cpu_has_fast_bf16()) << flag;
  }
}

// SDTRAIN_FORCE_BF16=1 computes in bf16 wherever oneDNN runs bf16 (AVX-512), even without bf16 instructions; on a
// CPU without AVX-512 it cannot, and float32 stays. 0 leaves the choice to the CPU; other values are named.
TEST(PrecisionPolicy, ForcedBf16ComputesInBf16WhereOnednnRunsIt) {
  {
    const ScopedEnv forced("SDTRAIN_FORCE_BF16", "1");
    const PrecisionPolicy p = PrecisionPolicy::from_flag("bf16");
    const at::ScalarType expected = cpu_runs_bf16_in_onednn() ? at::kBFloat16 : at::kFloat;
    EXPECT_EQ(p.compute, expected);
    EXPECT_EQ(p.frozen, expected);
    EXPECT_EQ(p.master, at::kFloat);
    EXPECT_FALSE(PrecisionPolicy::from_flag("no").mixed());
  }
  {
    const ScopedEnv off("SDTRAIN_FORCE_BF16", "0");
    EXPECT_EQ(PrecisionPolicy::from_flag("bf16").compute, cpu_has_fast_bf16() ? at::kBFloat16 : at::kFloat);
  }
  const ScopedEnv bad("SDTRAIN_FORCE_BF16", "yes");
  EXPECT_EQ(test::error_of([] { PrecisionPolicy::from_flag("bf16"); }),
            "SDTRAIN_FORCE_BF16: expected 1 or 0, got 'yes'");
}

TEST(PrecisionPolicy, AnUnknownFlagIsNamed) {
  EXPECT_EQ(test::error_of([] { PrecisionPolicy::from_flag("fp8"); }),
            "--mixed_precision: expected no, fp16 or bf16, got 'fp8'");
}

}  // namespace
}  // namespace sd::train
