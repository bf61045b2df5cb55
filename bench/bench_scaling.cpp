// Data-parallel scaling of textual inversion on one machine, same global batch: 1 rank x T threads against
// T ranks x 1 thread (`sdtrain launch`), on the tiny preset and the SD-1.5 architecture. Prints step time,
// images/s and the scaling efficiency (images/s of the ranks over images/s of the single rank) as JSON.
// Usage: build/bench_scaling [--cases tiny,sd15-256] [--ranks T] [--steps N] [--precision no|bf16] [--work DIR]
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::string cases = "tiny", precision = "bf16";
  int ranks = 2, steps = 0;
  fs::path work = fs::temp_directory_path() / "sdtrain-bench-ti";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--cases")) cases = argv[i + 1];
    if (!std::strcmp(argv[i], "--ranks")) ranks = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--steps")) steps = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--precision")) precision = argv[i + 1];
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
    const int warmup = tiny ? 5 : 1, measured = steps ? steps : (tiny ? 30 : 3);
    const fs::path model = work / preset;
    if (!sd::bench::ensure_preset(sdtrain, model, preset)) return 1;
    auto train = [&](const fs::path& out, int threads) {
      return std::vector<std::string>{"textual-inversion",
                                      "--pretrained_model_name_or_path=" + model.string(),
                                      "--train_data_dir=" + (work / "images").string(),
                                      "--placeholder_token=<bench>",
                                      "--initializer_token=toy",
                                      "--resolution=" + resolution,
                                      "--train_batch_size=1",
                                      "--seed=1",
                                      "--learning_rate=5e-4",
                                      "--max_train_steps=" + std::to_string(warmup + measured),
                                      "--mixed_precision=" + precision,
                                      "--threads=" + std::to_string(threads),
                                      "--checkpointing_steps=100000",
                                      "--save_steps=100000",
                                      "--output_dir=" + out.string()};
    };
    // One rank with all threads, accumulating `ranks` micro-batches of 1: the same global batch as `ranks` ranks.
    const fs::path single_out = work / ("scaling-" + name + "-1rank");
    fs::remove_all(single_out);
    std::vector<std::string> single = {sdtrain};
    for (auto& a : train(single_out, ranks)) single.push_back(a);
    single.push_back("--gradient_accumulation_steps=" + std::to_string(ranks));
    const auto single_run = sd::bench::run_child(single);
    const double single_step = sd::bench::median(sd::bench::step_times(single_out / "logs" / "metrics.jsonl", warmup));

    const fs::path multi_out = work / ("scaling-" + name + "-" + std::to_string(ranks) + "ranks");
    fs::remove_all(multi_out);
    std::vector<std::string> multi = {sdtrain, "launch", "--nproc_per_node", std::to_string(ranks), "--"};
    for (auto& a : train(multi_out, 1)) multi.push_back(a);
    const auto multi_run = sd::bench::run_child(multi);
    const double multi_step = sd::bench::median(sd::bench::step_times(multi_out / "logs" / "metrics.jsonl", warmup));

    nlohmann::json result = {{"bench", "textual_inversion_scaling"},
                             {"preset", preset},
                             {"resolution", std::stoi(resolution)},
                             {"mixed_precision", precision},
                             {"global_batch", ranks},
                             {"one_rank",
                              {{"threads", ranks},
                               {"median_step_s", single_step},
                               {"images_per_s", ranks / single_step},
                               {"exit_code", single_run.exit_code}}},
                             {"ranks",
                              {{"ranks", ranks},
                               {"threads_per_rank", 1},
                               {"median_step_s", multi_step},
                               {"images_per_s", ranks / multi_step},
                               {"exit_code", multi_run.exit_code}}},
                             {"scaling_efficiency", single_step / multi_step}};
    std::printf("%s\n", result.dump().c_str());
    std::fflush(stdout);
  }
}
