// Loader throughput alone, no model: the samples per second that `sdtrain train`'s loader threads deliver (read,
// JPEG decode, resize, random crop and flip to 512², tokenize) from one WebDataset shard and from an image folder,
// for each number of loader threads. This is the rate a training step can consume without waiting: data_wait_s in
// the metrics stays ~0 while a step takes longer than micro-batch / samples_per_s.
// Usage: build/bench_loader [--images 64] [--batches 48] [--threads 1,2] [--work DIR]
#include <cstdio>
#include <cstring>
#include <sstream>

#include "bench_util.h"
#include "core/threads.h"
#include "data/training_data.h"

namespace fs = std::filesystem;

namespace {

// The images of `dir` (imgK.jpg + imgK.txt) as one WebDataset shard, written by GNU tar: each key's members are
// consecutive, as img2dataset writes them.
bool write_shard(const fs::path& dir, int images, const fs::path& shard) {
  std::vector<std::string> tar = {"/usr/bin/tar", "-cf", shard.string(), "-C", dir.string()};
  for (int i = 0; i < images; ++i)
    for (const char* extension : {".jpg", ".txt"}) tar.push_back("img" + std::to_string(i) + extension);
  return sd::bench::run_child(tar).exit_code == 0;
}

}  // namespace

int main(int argc, char** argv) {
  int images = 64, batches = 48;
  std::string thread_counts = "1,2";
  fs::path work = fs::temp_directory_path() / "sdtrain-bench-loader";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--images")) images = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--batches")) batches = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--threads")) thread_counts = argv[i + 1];
    if (!std::strcmp(argv[i], "--work")) work = argv[i + 1];
  }
  sd::set_compute_threads(1);  // the loader's threads are its own; the compute pool only stacks the batches
  // A tiny pipeline for its tokenizer (the loader tokenizes captions).
  if (!sd::bench::ensure_preset(sd::bench::sdtrain_beside_me(), work / "tiny", "tiny")) return 1;
  const auto tokenizer = sd::text::ClipTokenizer::load(work / "tiny" / "tokenizer");
  const int width = 768, height = 640;  // 4:3-ish photos, downscaled to a short side of 512
  sd::bench::write_bench_jpegs(work / "jpg", images, width, height);
  if (!write_shard(work / "jpg", images, work / "shard.tar")) {
    std::fprintf(stderr, "bench_loader: tar failed to write %s\n", (work / "shard.tar").c_str());
    return 1;
  }

  const sd::data::BatchLayout layout{4, 1, 1};
  const uint64_t seed = 0;
  for (const std::string layout_name : {"webdataset", "kohya"}) {
    std::stringstream list(thread_counts);
    for (std::string threads; std::getline(list, threads, ',');) {
      sd::data::TrainingDataOptions o;
      if (layout_name == "webdataset")
        o.train_shards = (work / "shard.tar").string();
      else
        o.train_data_dir = (work / "jpg").string();
      o.transform = {512, /*center_crop=*/false, /*random_flip=*/true};
      o.dataloader_num_workers = std::stoi(threads);
      sd::data::TrainingData data = sd::data::open_training_data(o, tokenizer, {}, seed, layout, 0);
      int64_t step = 0;
      auto load = [&] { data.source->get(data.planner->plan(step++, 0)); };
      for (int w = 0; w < 4; ++w) load();  // warm-up: file cache, and the loader's look-ahead queue filled
      const auto start = std::chrono::steady_clock::now();
      for (int b = 0; b < batches; ++b) load();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const int64_t samples = static_cast<int64_t>(batches) * layout.batch;
      const nlohmann::json result = {{"bench", "loader"},
                                     {"layout", layout_name},
                                     {"images", fmt::format("{}x{} jpg", width, height)},
                                     {"resolution", 512},
                                     {"loader_threads", o.dataloader_num_workers},
                                     {"micro_batch", layout.batch},
                                     {"samples", samples},
                                     {"seconds", seconds},
                                     {"samples_per_s", static_cast<double>(samples) / seconds}};
      std::printf("%s\n", result.dump().c_str());
      std::fflush(stdout);
    }
  }
}
