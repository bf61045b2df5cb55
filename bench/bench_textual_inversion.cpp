// Textual-inversion training speed and memory, measured on the real command: each case runs
// `sdtrain textual-inversion` in its own process on a random-weight pipeline (tiny, or the SD-1.5 architecture),
// takes the median step time after a warm-up from its metrics log, and the process's peak RSS from wait4().
// Prints one JSON object per case.
// Usage: build/bench_textual_inversion [--cases tiny,sd15-256,sd15-512] [--threads N] [--steps N] [--work DIR]
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

#include "bench_util.h"

namespace fs = std::filesystem;

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
  const std::string sdtrain = sd::bench::sdtrain_beside_me();
  sd::bench::write_bench_images(work / "images", 4);

  std::stringstream list(cases);
  std::string name;
  while (std::getline(list, name, ',')) {
    const sd::bench::TrainingCase c = sd::bench::parse_case(name);
    const bool tiny = c.tiny();
    const std::string &preset = c.preset, &resolution = c.resolution;
    const std::string batch = tiny ? "2" : "1";
    const int warmup = tiny ? 3 : 1, measured = steps ? steps : (tiny ? 15 : 3);
    const fs::path model = work / preset;
    if (!sd::bench::ensure_preset(sdtrain, model, preset)) return 1;
    for (const std::string precision : {"no", "bf16"}) {
      const fs::path out = work / ("out-" + name + "-" + precision);
      fs::remove_all(out);
      sd::bench::ChildRun r =
          sd::bench::run_child({sdtrain, "textual-inversion", "--pretrained_model_name_or_path=" + model.string(),
                                "--train_data_dir=" + (work / "images").string(), "--placeholder_token=<bench>",
                                "--initializer_token=toy", "--resolution=" + resolution, "--train_batch_size=" + batch,
                                "--max_train_steps=" + std::to_string(warmup + measured), "--learning_rate=5e-4",
                                "--seed=1", "--mixed_precision=" + precision, "--threads=" + threads,
                                "--checkpointing_steps=100000", "--save_steps=100000", "--output_dir=" + out.string()});
      const std::vector<double> kept = sd::bench::step_times(out / "logs" / "metrics.jsonl", warmup);
      const double median = sd::bench::median(kept);
      nlohmann::json result = {{"bench", "textual_inversion_step"},
                               {"preset", preset},
                               {"resolution", std::stoi(resolution)},
                               {"batch", std::stoi(batch)},
                               {"mixed_precision", precision},
                               {"threads", std::stoi(threads)},
                               {"exit_code", r.exit_code},
                               {"warmup_steps", warmup},
                               {"median_step_s", median},
                               {"images_per_s", std::stoi(batch) / std::max(median, 1e-9)},
                               {"step_times_s", kept},
                               {"peak_rss_gib", r.peak_rss_gib}};
      std::printf("%s\n", result.dump().c_str());
      std::fflush(stdout);
    }
  }
}
