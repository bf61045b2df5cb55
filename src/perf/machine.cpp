#include "perf/machine.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/cpu_features.h"

namespace sd::perf {

std::string cpu_model_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    const size_t colon = line.find(':');
    if (line.rfind("model name", 0) != 0 || colon == std::string::npos) continue;
    const size_t begin = line.find_first_not_of(" \t", colon + 1);
    if (begin != std::string::npos) return line.substr(begin);
  }
  return "unknown CPU";
}

const char* cpu_kind() {
  if (cpu_has_fast_bf16()) return "AVX-512 with bf16 instructions";
  if (cpu_has_bf16_instructions()) return "AVX-512 with slow bf16 instructions";
  return cpu_runs_bf16_in_onednn() ? "AVX-512 without bf16 instructions" : "no AVX-512";
}

void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

namespace {

// A "<key>   <n> kB" line of a /proc file, in bytes, or -1.
int64_t proc_kib_field(const char* path, const std::string& key) {
  std::ifstream file(path);
  std::string line;
  while (std::getline(file, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;
  return -1;
}

}  // namespace

int64_t peak_rss_bytes() { return proc_kib_field("/proc/self/status", "VmHWM:"); }

int64_t huge_page_bytes() { return proc_kib_field("/proc/self/smaps_rollup", "AnonHugePages:"); }

NetworkBytes network_bytes() {
  // After two header lines, one line per interface: "  eth1: rx_bytes rx_packets ... (8 fields) tx_bytes ...".
  std::ifstream dev("/proc/net/dev");
  std::string line;
  NetworkBytes total;
  for (int i = 0; std::getline(dev, line); ++i) {
    const size_t colon = line.find(':');
    if (i < 2 || colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name == "lo") continue;
    std::istringstream fields(line.substr(colon + 1));
    int64_t received = 0, skipped = 0, sent = 0;
    fields >> received;
    for (int f = 0; f < 7; ++f) fields >> skipped;
    fields >> sent;
    total.sent += sent;
    total.received += received;
  }
  return total;
}

double gemm_gflops(at::ScalarType dtype, int64_t n, int repeats) {
  const at::Tensor a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
  // The first products after a pause run at half speed (the threads waking, the caches filling).
  for (int i = 0; i < 2; ++i) at::mm(a, b);
  double fastest = std::numeric_limits<double>::infinity();
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    at::mm(a, b);
    fastest = std::min(fastest, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * static_cast<double>(n) * n * n / fastest / 1e9;
}

}  // namespace sd::perf
