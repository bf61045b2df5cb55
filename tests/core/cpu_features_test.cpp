#include "core/cpu_features.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace sd {
namespace {

// The kernel's own account of the CPU: the flags of /proc/cpuinfo's first processor.
std::set<std::string> proc_cpuinfo_flags() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line))
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      std::set<std::string> flags;
      for (std::string w; words >> w;) flags.insert(w);
      return flags;
    }
  return {};
}

TEST(CpuFeatures, AgreeWithTheKernelsFlags) {
  const std::set<std::string> flags = proc_cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags here";
  const bool avx512_for_onednn = flags.count("avx512bw") && flags.count("avx512vl") && flags.count("avx512dq");
  EXPECT_EQ(cpu_runs_bf16_in_onednn(), avx512_for_onednn);
  // An AVX-512 CPU without bf16 instructions (Skylake-SP to Ice Lake) must not count as fast: its emulated bf16
  // runs at a quarter of float32's speed.
  EXPECT_EQ(cpu_has_fast_bf16(), avx512_for_onednn && flags.count("avx512_bf16") > 0);
}

}  // namespace
}  // namespace sd
