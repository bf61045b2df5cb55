// Benchmark helpers: warm-up then the median of repeats, peak resident memory per case (the kernel's high-water
// mark, reset between cases), and one JSON object per case on stdout.
#pragma once
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace sd::bench {

// Resets the process's peak-RSS mark (Linux >= 4.0), so the next peak_rss_bytes() covers only what follows.
inline void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

inline int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

struct Timing {
  double median_s = 0;
  double min_s = 0;
  std::vector<double> samples_s;
};

// Runs `fn` `warmup` times untimed, then `repeats` times timed.
inline Timing time_it(const std::function<void()>& fn, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) fn();
  Timing t;
  for (int i = 0; i < repeats; ++i) {
    auto start = std::chrono::steady_clock::now();
    fn();
    t.samples_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  auto sorted = t.samples_s;
  std::sort(sorted.begin(), sorted.end());
  t.median_s = sorted[sorted.size() / 2];
  t.min_s = sorted.front();
  return t;
}

inline nlohmann::json timing_json(const Timing& t) {
  return {{"median_s", t.median_s}, {"min_s", t.min_s}, {"samples_s", t.samples_s},
          {"threads", at::get_num_threads()}};
}

}  // namespace sd::bench
