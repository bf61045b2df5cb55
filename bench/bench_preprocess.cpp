// `sdtrain preprocess` throughput: the images per second that its engine (train::LatentEncoder) turns from JPEGs
// into stored VAE posteriors and CLIP text embeddings: decoding and resizing on a loader thread, the VAE encoder and
// the text encoder on the compute threads. Loading the models and a warm-up batch are not timed; writing the shard
// (one safetensors file of a few MB) is left out.
// Usage: build/bench_preprocess [--cases tiny,sd15-256,sd15-512] [--images 16] [--batch_size 4] [--threads N]
//                               [--work DIR]
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "bench_util.h"
#include "core/threads.h"
#include "train/preprocess.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::string cases = "tiny,sd15-256";
  int images = 16, batch_size = 4;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  fs::path work = fs::temp_directory_path() / "sdtrain-bench-preprocess";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--cases")) cases = argv[i + 1];
    if (!std::strcmp(argv[i], "--images")) images = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--batch_size")) batch_size = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--threads")) threads = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--work")) work = argv[i + 1];
  }
  sd::set_compute_threads(threads);
  const int width = 768, height = 640;
  sd::bench::write_bench_jpegs(work / "jpg", images, width, height);

  std::stringstream list(cases);
  for (std::string name; std::getline(list, name, ',');) {
    const sd::bench::TrainingCase c = sd::bench::parse_case(name);
    const fs::path model = work / c.preset;
    if (!sd::bench::ensure_preset(sd::bench::sdtrain_beside_me(), model, c.preset)) return 1;
    sd::train::PreprocessOptions o;
    o.model.name_or_path = model.string();
    o.inputs.train_data_dir = (work / "jpg").string();
    o.resolution = {std::stoi(c.resolution)};
    o.batch_size = batch_size;
    sd::bench::reset_peak_rss();
    sd::train::LatentEncoder encoder(o);
    const auto dataset = sd::data::open_image_captions(o.inputs, 1);
    encoder.encode(*dataset, 0, batch_size);  // warm-up
    const auto timing = sd::bench::time_it([&] { encoder.encode(*dataset, 0, images); }, 0, 1);
    const nlohmann::json result = {{"bench", "preprocess"},
                                   {"case", name},
                                   {"images", fmt::format("{} of {}x{} jpg", images, width, height)},
                                   {"resolution", o.resolution[0]},
                                   {"batch_size", batch_size},
                                   {"threads", threads},
                                   {"seconds", timing.median_s},
                                   {"images_per_s", images / timing.median_s},
                                   {"peak_rss_gib", static_cast<double>(sd::bench::peak_rss_bytes()) / (1 << 30)}};
    std::printf("%s\n", result.dump().c_str());
    std::fflush(stdout);
  }
}
