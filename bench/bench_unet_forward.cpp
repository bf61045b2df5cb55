// One SD-1.5 UNet forward at 64x64 latents (a 512x512 image), batch 1, in float32 and bfloat16: time (warm-up 1,
// median of 3) and peak resident memory of each case, as JSON lines.
// Usage: build/bench_unet_forward [--threads N] [--repeats R]
#include <ATen/Parallel.h>
#include <torch/types.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "core/threads.h"
#include "bench_util.h"
#include "models/unet/unet_2d_condition.h"
#include "models/weights.h"

int main(int argc, char** argv) {
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int repeats = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::stoi(argv[i + 1]);
  }
  sd::set_compute_threads(threads);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    sd::bench::reset_peak_rss();
    torch::InferenceMode inference;
    at::manual_seed(0);
    sd::models::UNet2DConditionModel unet = [&] {
      sd::models::ScopedDefaultDtype built_in(dtype);  // as load_unet: no float32 copy of bf16 weights
      return sd::models::UNet2DConditionModel(sd::models::UNetConfig::sd15());
    }();
    const auto opts = at::TensorOptions().dtype(dtype);
    at::Tensor sample = at::randn({1, 4, 64, 64}).to(opts);
    at::Tensor timestep = at::full({1}, 500, at::kLong);
    at::Tensor context = at::randn({1, 77, 768}).to(opts);
    auto timing = sd::bench::time_it([&] { unet->forward(sample, timestep, context); }, 1, repeats);
    nlohmann::json out = {{"bench", "unet_forward"},
                          {"model", "sd15"},
                          {"latent", "64x64"},
                          {"batch", 1},
                          {"dtype", dtype == at::kFloat ? "float32" : "bfloat16"},
                          {"peak_rss_gib", sd::bench::peak_rss_bytes() / double(1 << 30)}};
    out.update(sd::bench::timing_json(timing));
    std::printf("%s\n", out.dump().c_str());
    std::fflush(stdout);
  }
}
