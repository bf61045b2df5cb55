#include "core/cpu_features.h"

#include <gtest/gtest.h>

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
  // An AVX-512 CPU without bf16 instructions (Skylake-SP to Ice Lake) must not count as fast: its emulated bf16
  // runs at a quarter of float32's speed.
  EXPECT_EQ(cpu_has_fast_bf16(), cpuinfo->instructions);
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
