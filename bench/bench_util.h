// Benchmark helpers: warm-up then the median of repeats, peak resident memory per case (the kernel's high-water
// mark, reset between cases), and one JSON object per case on stdout.
#pragma once
#include <ATen/Parallel.h>
#include <c10/core/ScalarType.h>
#include <sys/resource.h>
#include <stb_image_write.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/image.h"
#include "perf/machine.h"

namespace sd::bench {

using perf::peak_rss_bytes;
using perf::reset_peak_rss;

struct Timing {
  double median_s = 0;
  double min_s = 0;
  std::vector<double> samples_s;
};

// Runs `fn` `warmup` times untimed, then `repeats` times timed, each timed run after an untimed `before_each` (if
// given).
inline Timing time_it(const std::function<void()>& fn, int warmup, int repeats,
                      const std::function<void()>& before_each = {}) {
  for (int i = 0; i < warmup; ++i) fn();
  Timing t;
  for (int i = 0; i < repeats; ++i) {
    if (before_each) before_each();
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
  return {{"median_s", t.median_s}, {"min_s", t.min_s}, {"samples_s", t.samples_s}, {"threads", at::get_num_threads()}};
}

// A benchmarked command run in its own process: its exit code and its peak resident memory (from wait4).
struct ChildRun {
  int exit_code = -1;
  double peak_rss_gib = 0;
};

inline ChildRun run_child(const std::vector<std::string>& args) {
  pid_t pid = fork();
  if (pid == 0) {
    // The command's own stdout (the paths it wrote) would mix with the JSON results.
    if (!std::freopen("/dev/null", "w", stdout)) _exit(126);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  struct rusage usage {};
  wait4(pid, &status, 0, &usage);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), usage.ru_maxrss / double(1 << 20)};
}

// The sdtrain binary beside the benchmark's own executable.
inline std::string sdtrain_beside_me() {
  return (std::filesystem::canonical("/proc/self/exe").parent_path() / "sdtrain").string();
}

// step_time_s of every line of a training run's metrics.jsonl, minus the first `warmup`.
inline std::vector<double> step_times(const std::filesystem::path& metrics, size_t warmup) {
  std::vector<double> out;
  std::ifstream in(metrics);
  std::string line;
  for (size_t i = 0; std::getline(in, line); ++i)
    if (i >= warmup) out.push_back(nlohmann::json::parse(line)["step_time_s"].get<double>());
  return out;
}

// `count` 600x520 patterned PNGs in `dir`: training images for the textual-inversion benchmarks.
inline void write_bench_images(const std::filesystem::path& dir, int count) {
  std::filesystem::create_directories(dir);
  for (int i = 0; i < count; ++i) {
    sd::io::RgbImage image{600, 520, std::vector<uint8_t>(600 * 520 * 3)};
    for (size_t p = 0; p < image.pixels.size(); ++p) image.pixels[p] = static_cast<uint8_t>((p * (3 + i)) % 241);
    sd::io::save_png(dir / ("img" + std::to_string(i) + ".png"), image);
  }
}

// `count` width x height JPEGs (quality 90) with kohya captions beside them (imgK.jpg + imgK.txt) in `dir`: smooth
// gradients with a fine texture, so they compress about as photos do rather than to almost nothing.
inline void write_bench_jpegs(const std::filesystem::path& dir, int count, int width, int height) {
  std::filesystem::create_directories(dir);
  for (int i = 0; i < count; ++i) {
    std::vector<uint8_t> pixels(static_cast<size_t>(width) * height * 3);
    for (int y = 0; y < height; ++y)
      for (int x = 0; x < width; ++x)
        for (int c = 0; c < 3; ++c)
          pixels[(static_cast<size_t>(y) * width + x) * 3 + c] =
              static_cast<uint8_t>((x * (c + 1) + y * (3 - c) + 37 * i) / 4 + ((x * 7 + y * 13 + i) % 23));
    const std::string stem = (dir / ("img" + std::to_string(i))).string();
    SD_CHECK(stbi_write_jpg((stem + ".jpg").c_str(), width, height, 3, pixels.data(), 90) != 0,
             "{}.jpg: cannot write the benchmark image", stem);
    std::ofstream(stem + ".txt") << "a benchmark image, number " << i << ", gradient, texture";
  }
}

// The --dtype of the kernel benchmarks: "float32" or "bf16". Anything else ends the benchmark with a line rather
// than measuring float32 under another name.
inline at::ScalarType dtype_from_name(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bf16") return at::kBFloat16;
  std::fprintf(stderr, "--dtype: expected float32 or bf16, got '%s'\n", name.c_str());
  std::exit(2);
}

// A training benchmark case by name: "tiny" (64x64) or "sd15-RES" (the SD-1.5 architecture at RES x RES).
struct TrainingCase {
  std::string preset;
  std::string resolution;
  bool tiny() const { return preset == "tiny"; }
};

inline TrainingCase parse_case(const std::string& name) {
  if (name == "tiny") return {"tiny", "64"};
  return {"sd15", name.substr(name.find('-') + 1)};
}

// The random-weight pipeline of `preset` under `work`, written by `sdtrain init` the first time it is needed.
// Returns false (with a message) if init failed.
inline bool ensure_preset(const std::string& sdtrain, const std::filesystem::path& model, const std::string& preset) {
  if (std::filesystem::exists(model / "model_index.json")) return true;
  if (run_child({sdtrain, "init", "--preset", preset, "--out", model.string()}).exit_code == 0) return true;
  std::fprintf(stderr, "bench: sdtrain init --preset %s failed\n", preset.c_str());
  return false;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace sd::bench
