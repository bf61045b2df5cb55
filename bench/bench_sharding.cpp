// Sharded against unsharded UNet training, in one run: `sdtrain benchmark` on 1 rank x R threads with no_shard
// (accumulating R micro-batches, so the global batch is the same) and under `sdtrain launch` on R ranks x 1 thread
// with shard_grad_op. Prints one JSON object: each rank's peak RSS and its ratio to the unsharded rank's, and the
// images/s of both with their ratio (the scaling efficiency).
// Usage: build/bench_sharding [--preset sd15] [--resolution 256] [--ranks 2] [--steps 3] [--precision bf16]
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.h"

namespace {

using nlohmann::json;

// Runs `command` through the shell; the JSON lines it prints (one per rank), or an empty list if it failed.
std::vector<json> json_lines(const std::string& command) {
  std::fprintf(stderr, "bench_sharding: %s\n", command.c_str());
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {};
  std::vector<json> lines;
  char buffer[1 << 16];
  while (std::fgets(buffer, sizeof(buffer), pipe))
    if (buffer[0] == '{') lines.push_back(json::parse(buffer));
  return pclose(pipe) == 0 ? lines : std::vector<json>{};
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "sd15", resolution = "256", precision = "bf16";
  int ranks = 2, steps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--preset")) preset = argv[i + 1];
    if (!std::strcmp(argv[i], "--resolution")) resolution = argv[i + 1];
    if (!std::strcmp(argv[i], "--ranks")) ranks = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--steps")) steps = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--precision")) precision = argv[i + 1];
  }
  const std::string sdtrain = sd::bench::sdtrain_beside_me();
  const std::string benchmark = " benchmark --task unet --preset " + preset + " --resolution " + resolution +
                                " --train_batch_size 1 --mixed_precision " + precision + " --steps " +
                                std::to_string(steps) + " --warmup 1";
  const std::string r = std::to_string(ranks);
  const std::vector<json> single =
      json_lines(sdtrain + benchmark + " --sharding no_shard --threads " + r + " --gradient_accumulation_steps " + r);
  const std::vector<json> sharded = json_lines(sdtrain + " launch --nproc_per_node " + r + " --" + benchmark +
                                               " --sharding shard_grad_op --threads 1");
  if (single.size() != 1 || sharded.size() != static_cast<size_t>(ranks)) {
    std::fprintf(stderr, "bench_sharding: a benchmark run failed (see above)\n");
    return 1;
  }
  const double single_peak = single[0]["peak_rss_gib"];
  json per_rank = json::array();
  double worst_ratio = 0;
  for (const json& rank : sharded) {
    const double ratio = rank["peak_rss_gib"].get<double>() / single_peak;
    worst_ratio = std::max(worst_ratio, ratio);
    per_rank.push_back({{"peak_rss_gib", rank["peak_rss_gib"]}, {"ratio_to_unsharded", ratio}});
  }
  const double single_images = single[0]["images_per_s"], sharded_images = sharded[0]["images_per_s"];
  const json result = {{"bench", "sharding"},
                       {"preset", preset},
                       {"resolution", std::stoi(resolution)},
                       {"mixed_precision", precision},
                       {"compute_dtype", single[0]["compute_dtype"]},
                       {"global_batch", ranks},
                       {"unsharded",
                        {{"ranks", 1},
                         {"threads", ranks},
                         {"peak_rss_gib", single_peak},
                         {"s_per_step", single[0]["s_per_step"]},
                         {"images_per_s", single_images}}},
                       {"sharded",
                        {{"ranks", ranks},
                         {"threads_per_rank", 1},
                         {"per_rank", per_rank},
                         {"s_per_step", sharded[0]["s_per_step"]},
                         {"images_per_s", sharded_images}}},
                       {"max_peak_ratio", worst_ratio},
                       {"scaling_efficiency", sharded_images / single_images}};
  std::printf("%s\n", result.dump().c_str());
}
