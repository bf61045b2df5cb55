#include "core/cpu_features.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "core/error.h"
#include "models/model_test_util.h"
#include "test_util.h"

namespace sd {
namespace {

TEST(CpuFeatures, AgreeWithTheKernelsFlags) {
  const auto cpuinfo = test::proc_cpuinfo_bf16();
  if (!cpuinfo) GTEST_SKIP() << "no /proc/cpuinfo flags here";
  EXPECT_EQ(cpu_runs_bf16_in_onednn(), cpuinfo->in_onednn);
  EXPECT_EQ(cpu_has_bf16_instructions(), cpuinfo->instructions);
  // An AVX-512 CPU without bf16 instructions (Skylake-SP to Ice Lake) must not count as fast: its emulated bf16
  // runs at a quarter of float32's speed.
  if (!cpuinfo->instructions) {
    EXPECT_FALSE(cpu_has_fast_bf16());
  }
}

// The dot products' rate is a ratio of two timings on a shared host, so it must not land on the other side of the
// line from one measurement to the next; and it must be a rate some CPU could have (each of the two loops kept all
// its work: a loop the compiler shortened would read far off).
TEST(CpuFeatures, Bf16DotProductRateIsMeasuredSteadily) {
  if (!cpu_has_bf16_instructions()) {
    EXPECT_EQ(cpu_bf16_dot_product_rate(), 0);
    GTEST_SKIP() << "this CPU has no bf16 instructions";
  }
  const double kept = cpu_bf16_dot_product_rate();
  std::printf("bf16 dot products: %.2f of float32's multiply-add flops\n", kept);
  EXPECT_GT(kept, 0.25);
  EXPECT_LT(kept, 4.0);
  for (int k = 0; k < 3; ++k) {
    const double again = measure_bf16_dot_product_rate();
    EXPECT_EQ(again >= kFastBf16DotProductRate, kept >= kFastBf16DotProductRate) << again << " against " << kept;
  }
  if (kept >= kFastBf16DotProductRate) {
    EXPECT_TRUE(cpu_has_fast_bf16());
  }
}

TEST(CpuFeatures, KernelVectorWidthIsOneTheCpuRuns) {
  const int widest = kernel_vector_bits();
  EXPECT_EQ(widest, __builtin_cpu_supports("avx512f") ? 512 : 256);
  const std::string message = test::error_message([] { set_kernel_vector_bits(128); });
  EXPECT_NE(message.find("vector width 128 bits: expected 256 or, on a CPU with AVX-512F, 512"), std::string::npos)
      << message;
  if (widest == 256) {
    EXPECT_THROW(set_kernel_vector_bits(512), Error);  // a CPU without AVX-512F
  }
  set_kernel_vector_bits(256);
  EXPECT_EQ(kernel_vector_bits(), 256);
  set_kernel_vector_bits(widest);
}

}  // namespace
}  // namespace sd
