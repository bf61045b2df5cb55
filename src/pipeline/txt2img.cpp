#include "pipeline/txt2img.h"

#include <optional>

#include "core/error.h"
#include "core/progress.h"
#include "pipeline/prompt_encoding.h"

namespace sd::pipeline {

std::pair<int64_t, int64_t> resolve_image_size(const StableDiffusion& pipe, const Txt2ImgOptions& o) {
  const int64_t f = pipe.vae_scale_factor();
  const auto& sample_size = pipe.unet->config().sample_size;
  SD_CHECK((o.height > 0 && o.width > 0) || sample_size,
           "the UNet config has no sample_size, so the image height and width must be given");
  const int64_t height = o.height > 0 ? o.height : *sample_size * f;
  const int64_t width = o.width > 0 ? o.width : *sample_size * f;
  SD_CHECK(height % f == 0, "height {} is not a multiple of {}, the VAE's scale factor", height, f);
  SD_CHECK(width % f == 0, "width {} is not a multiple of {}, the VAE's scale factor", width, f);
  return {height, width};
}

void check_txt2img_options(const Txt2ImgOptions& o, const schedulers::Scheduler& scheduler) {
  check_generation_options(o, scheduler);
  SD_CHECK(o.guidance_rescale >= 0 && o.guidance_rescale <= 1, "guidance_rescale must be in [0, 1], got {}",
           o.guidance_rescale);
}

namespace {

// The given latents after checking them, else one randn draw per image.
at::Tensor initial_latents(const Txt2ImgOptions& o, const std::vector<int64_t>& shape,
                           std::vector<at::Generator>& generators, int64_t height, int64_t width) {
  const auto n = static_cast<int64_t>(generators.size());
  if (!o.initial_latents.defined()) return randn_per_image(generators, shape);
  const at::Tensor& given = o.initial_latents;
  std::vector<int64_t> expected{n};
  expected.insert(expected.end(), shape.begin(), shape.end());
  SD_CHECK(given.sizes() == at::IntArrayRef(expected),
           "initial latents have shape [{}] but {} image(s) of {}x{} need [{}]", fmt::join(given.sizes(), ", "), n,
           width, height, fmt::join(expected, ", "));
  SD_CHECK(given.is_floating_point(), "initial latents must be floating point");
  return given.to(at::kFloat);
}

}  // namespace

GenerationResult txt2img(StableDiffusion& pipe, schedulers::Scheduler& scheduler, const Txt2ImgOptions& o,
                         const GenerationHooks& hooks) {
  check_txt2img_options(o, scheduler);
  const auto [height, width] = resolve_image_size(pipe, o);
  const int64_t f = pipe.vae_scale_factor();
  const int64_t n = static_cast<int64_t>(o.prompts.size()) * o.num_images_per_prompt;
  const std::vector<int64_t> latent_shape{pipe.unet->config().in_channels, height / f, width / f};
  // Before any model runs, so a bad step count fails fast.
  prepare_scheduler(scheduler, o);

  const Guidance guidance{o.guidance_scale, o.guidance_rescale};
  GenerationResult result;
  result.encoder_hidden_states = encode_prompt(pipe, o, guidance.enabled());
  std::vector<at::Generator> generators = image_generators(o.seed, n);
  for (int64_t k = 0; k < n; ++k) result.seeds.push_back(o.seed + static_cast<uint64_t>(k));

  at::Tensor latents = initial_latents(o, latent_shape, generators, height, width) * scheduler.init_noise_sigma();
  latents = denoise(pipe, scheduler, latents, scheduler.timesteps(), result.encoder_hidden_states, guidance, generators,
                    hooks);
  result.images = decode_latents(pipe, latents);
  result.images_uint8 = to_uint8(result.images);
  return result;
}

GenerationResult txt2img_with_progress(StableDiffusion& pipe, schedulers::Scheduler& scheduler,
                                       const Txt2ImgOptions& options, const std::string& label) {
  std::optional<ProgressBar> bar;
  GenerationHooks hooks;
  hooks.on_progress = [&](int done, int total) {
    // The step count is known once txt2img has set the scheduler up: the bar starts after the first step.
    if (!bar) bar.emplace(label, total, done);
    bar->update(done);
  };
  GenerationResult result = txt2img(pipe, scheduler, options, hooks);
  if (bar) bar->finish();
  return result;
}

}  // namespace sd::pipeline
