// Textual-inversion training speed and memory, measured on the real command: each case runs
// `sdtrain textual-inversion` in its own process on a random-weight pipeline (tiny, or the SD-1.5 architecture),
// takes the median step time after a warm-up from its metrics log, and the process's peak RSS from wait4().
// Prints one JSON object per case.
// Usage: build/bench_textual_inversion [--cases tiny,sd15-256,sd15-512] [--threads N] [--steps N] [--work DIR]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "io/image.h"

namespace fs = std::filesystem;

namespace {

struct Run {
  int exit_code = -1;
  double peak_rss_gib = 0;
};

Run run(const std::vector<std::string>& args) {
  pid_t pid = fork();
  if (pid == 0) {
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

std::vector<double> step_times(const fs::path& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)["step_time_s"].get<double>());
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string cases = "tiny,sd15-256";
  std::string threads = std::to_string(std::thread::hardware_concurrency());
  int steps = 0;
  fs::path work = fs::temp_directory_path() / "sdtrain-bench-ti";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--cases")) cases = argv[i + 1];
    if (!std::strcmp(argv[i], "--threads")) threads = argv[i + 1];
    if (!std::strcmp(argv[i], "--steps")) steps = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--work")) work = argv[i + 1];
  }
  const std::string sdtrain = (fs::canonical("/proc/self/exe").parent_path() / "sdtrain").string();
  fs::create_directories(work / "images");
  for (int i = 0; i < 4; ++i) {
    sd::io::RgbImage image{600, 520, {}};
    image.pixels.resize(600 * 520 * 3);
    for (size_t p = 0; p < image.pixels.size(); ++p) image.pixels[p] = static_cast<uint8_t>((p * (3 + i)) % 241);
    sd::io::save_png(work / "images" / ("img" + std::to_string(i) + ".png"), image);
  }

  std::stringstream list(cases);
  std::string name;
  while (std::getline(list, name, ',')) {
    const bool tiny = name == "tiny";
    const std::string preset = tiny ? "tiny" : "sd15";
    const std::string resolution = tiny ? "64" : name.substr(name.find('-') + 1);
    const std::string batch = tiny ? "2" : "1";
    const int warmup = tiny ? 3 : 1, measured = steps ? steps : (tiny ? 15 : 3);
    const fs::path model = work / preset;
    if (!fs::exists(model / "model_index.json") &&
        run({sdtrain, "init", "--preset", preset, "--out", model.string()}).exit_code != 0) {
      std::fprintf(stderr, "bench: init --preset %s failed\n", preset.c_str());
      return 1;
    }
    for (const std::string precision : {"no", "bf16"}) {
      const fs::path out = work / ("out-" + name + "-" + precision);
      fs::remove_all(out);
      Run r = run({sdtrain, "textual-inversion", "--pretrained_model_name_or_path=" + model.string(),
                   "--train_data_dir=" + (work / "images").string(), "--placeholder_token=<bench>",
                   "--initializer_token=toy", "--resolution=" + resolution, "--train_batch_size=" + batch,
                   "--max_train_steps=" + std::to_string(warmup + measured), "--learning_rate=5e-4", "--seed=1",
                   "--mixed_precision=" + precision, "--threads=" + threads, "--checkpointing_steps=100000",
                   "--save_steps=100000", "--output_dir=" + out.string()});
      std::vector<double> times = step_times(out / "logs" / "metrics.jsonl");
      std::vector<double> kept(times.begin() + std::min<size_t>(warmup, times.size()), times.end());
      nlohmann::json result = {{"bench", "textual_inversion_step"},
                               {"preset", preset},
                               {"resolution", std::stoi(resolution)},
                               {"batch", std::stoi(batch)},
                               {"mixed_precision", precision},
                               {"threads", std::stoi(threads)},
                               {"exit_code", r.exit_code},
                               {"warmup_steps", warmup},
                               {"median_step_s", median(kept)},
                               {"images_per_s", std::stoi(batch) / std::max(median(kept), 1e-9)},
                               {"step_times_s", kept},
                               {"peak_rss_gib", r.peak_rss_gib}};
      std::printf("%s\n", result.dump().c_str());
      std::fflush(stdout);
    }
  }
}
