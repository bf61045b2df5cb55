#include "core/cpu_features.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace sd {
namespace {

TEST(CpuFeatures, AgreeWithTheKernelsFlags) {
  const std::set<std::string> flags = test::proc_cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags here";
  const bool avx512_for_onednn = flags.count("avx512bw") && flags.count("avx512vl") && flags.count("avx512dq");
  EXPECT_EQ(cpu_runs_bf16_in_onednn(), avx512_for_onednn);
  // An AVX-512 CPU without bf16 instructions (Skylake-SP to Ice Lake) must not count as fast: its emulated bf16
  // runs at a quarter of float32's speed.
  EXPECT_EQ(cpu_has_fast_bf16(), avx512_for_onednn && flags.count("avx512_bf16") > 0);
}

}  // namespace
}  // namespace sd
