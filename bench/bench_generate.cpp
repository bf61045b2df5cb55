// Generation benchmark: seconds per denoising step (scale_model_input + UNet on the guided batch of 2 + guidance +
// scheduler step) and VAE decode time, with peak memory, for the SD-1.5 architecture with random weights built
// in memory. One JSON object per dtype on stdout. Without --dtype it runs float32 and bf16, each in a fresh
// process so one case's freed memory cannot inflate the other's peak.
//   bench_generate [--dtype float32|bf16] [--size 512] [--threads N]
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/threads.h"
#include "bench_util.h"
#include "core/assets.h"
#include "io/atomic_file.h"
#include "models/weights.h"
#include "pipeline/stable_diffusion.h"
#include "pipeline/txt2img.h"
#include "schedulers/factory.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// runwayml/stable-diffusion-v1-5 scheduler/scheduler_config.json.
sd::schedulers::SchedulerConfig sd15_scheduler_config() {
  nlohmann::json j = {{"_class_name", "PNDMScheduler"},   {"beta_start", 0.00085},       {"beta_end", 0.012},
                      {"beta_schedule", "scaled_linear"}, {"num_train_timesteps", 1000}, {"set_alpha_to_one", false},
                      {"skip_prk_steps", true},           {"steps_offset", 1},           {"clip_sample", false}};
  return sd::schedulers::SchedulerConfig::from_json(sd::io::JsonConfig(j, "sd15 scheduler_config"));
}

// The real CLIP vocabulary linked into the binary, written where ClipTokenizer::load can read it.
sd::text::ClipTokenizer builtin_tokenizer() {
  const fs::path dir = fs::temp_directory_path() / fmt::format("sdtrain-bench-tokenizer-{}", getpid());
  sd::io::write_text_file(dir / "vocab.json", std::string(sd::assets::clip_vocab_json()));
  sd::io::write_text_file(dir / "merges.txt", std::string(sd::assets::clip_merges_txt()));
  auto tokenizer = sd::text::ClipTokenizer::load(dir);
  fs::remove_all(dir);
  return tokenizer;
}

int run_case(const std::string& dtype_name, int64_t size) {
  const at::ScalarType dtype = sd::bench::dtype_from_name(dtype_name);
  const auto build_start = Clock::now();
  sd::pipeline::StableDiffusion pipe{sd::pipeline::model_index_json("PNDMScheduler"),
                                     builtin_tokenizer(),
                                     nullptr,
                                     nullptr,
                                     nullptr,
                                     sd15_scheduler_config()};
  {
    at::NoGradGuard no_grad;  // random init without autograd bookkeeping
    pipe.text_encoder = sd::models::ClipTextModel(sd::models::ClipTextConfig::sd15());
    pipe.vae = sd::models::AutoencoderKL(sd::models::VaeConfig::sd());
    pipe.unet = sd::models::UNet2DConditionModel(sd::models::UNetConfig::sd15());
    pipe.vae->to(dtype);
    pipe.unet->to(dtype);
  }
  for (auto* m : std::initializer_list<torch::nn::Module*>{pipe.text_encoder.get(), pipe.vae.get(), pipe.unet.get()}) {
    m->eval();
    for (auto& p : m->parameters()) p.set_requires_grad(false);
  }
  const double build_s = seconds_since(build_start);
  int64_t weight_bytes = 0;
  for (auto* m : std::initializer_list<torch::nn::Module*>{pipe.text_encoder.get(), pipe.vae.get(), pipe.unet.get()})
    for (const auto& p : m->parameters()) weight_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  malloc_trim(0);  // hand the float32 copies freed by the bf16 conversion back before measuring peaks

  // 3 inference steps of PNDM (skip_prk_steps) are 4 UNet calls: the first is the warm-up, the median of the
  // other three is the number reported.
  auto scheduler = sd::schedulers::make_scheduler(pipe.scheduler_config);
  sd::pipeline::Txt2ImgOptions o;
  o.prompts = {"a photo of an astronaut riding a horse on mars"};
  o.num_inference_steps = 3;
  o.height = o.width = size;
  o.seed = 0;
  std::vector<double> step_s;
  int64_t peak_sampling = 0;
  auto mark = Clock::now();
  sd::pipeline::Txt2ImgHooks hooks;
  hooks.on_progress = [&](int done, int total) {
    step_s.push_back(seconds_since(mark));
    if (done == total) peak_sampling = sd::bench::peak_rss_bytes();
    mark = Clock::now();
  };
  sd::bench::reset_peak_rss();
  const auto run_start = Clock::now();
  sd::pipeline::Txt2ImgResult result = sd::pipeline::txt2img(pipe, *scheduler, o, hooks);
  const double first_decode_s = seconds_since(mark);
  const double run_s = seconds_since(run_start);

  sd::bench::Timing steps;
  steps.samples_s.assign(step_s.begin() + 1, step_s.end());
  auto sorted = steps.samples_s;
  std::sort(sorted.begin(), sorted.end());
  steps.median_s = sorted[sorted.size() / 2];
  steps.min_s = sorted.front();

  // The decode inside the run above was the VAE's warm-up.
  const at::Tensor latents = at::randn({1, 4, size / pipe.vae_scale_factor(), size / pipe.vae_scale_factor()});
  sd::bench::reset_peak_rss();
  const sd::bench::Timing decode = sd::bench::time_it([&] { sd::pipeline::decode_latents(pipe, latents); }, 0, 3);
  const int64_t peak_decode = sd::bench::peak_rss_bytes();

  nlohmann::json out = {{"bench", "generate"},
                        {"model", "SD-1.5 architecture, random weights"},
                        {"dtype", dtype_name},
                        {"height", size},
                        {"width", size},
                        {"unet_batch", 2},
                        {"scheduler", scheduler->class_name()},
                        {"seconds_per_step", steps.median_s},
                        {"step", sd::bench::timing_json(steps)},
                        {"warmup_step_s", step_s.front()},
                        {"vae_decode_s", decode.median_s},
                        {"vae_decode", sd::bench::timing_json(decode)},
                        {"vae_decode_first_s", first_decode_s},
                        {"whole_call_s", run_s},
                        {"peak_rss_sampling_bytes", peak_sampling},
                        {"peak_rss_decode_bytes", peak_decode},
                        {"weight_bytes", weight_bytes},
                        {"build_s", build_s},
                        {"image_mean", result.images.mean().item<double>()}};
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Seconds per denoising step and peak memory, SD-1.5 architecture, guided batch of 2"};
  std::string dtype;
  int64_t size = 512;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  app.add_option("--dtype", dtype, "float32 or bf16 (default: both, each in its own process)")
      ->check(CLI::IsMember({"float32", "bf16"}));
  app.add_option("--size", size, "Image height and width")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "Intra-op threads")->capture_default_str()->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (dtype.empty()) {
    int rc = 0;
    for (const char* d : {"float32", "bf16"}) {
      const std::string cmd = fmt::format("/proc/{}/exe --dtype {} --size {} --threads {}", getpid(), d, size, threads);
      if (std::system(cmd.c_str()) != 0) rc = 1;
    }
    return rc;
  }
  sd::set_compute_threads(threads);
  try {
    return run_case(dtype, size);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_generate: %s\n", e.what());
    return 1;
  }
}
