#include "core/cpu_features.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace sd
