#include "pipeline/img2img.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "core/error.h"
#include "pipeline/prompt_encoding.h"

namespace sd::pipeline {

namespace {

// int(n * strength) as Python truncates it: the number of inference steps img2img runs.
int steps_to_run(int num_inference_steps, double strength) {
  return std::min(static_cast<int>(num_inference_steps * strength), num_inference_steps);
}

// One VAE sample per image, each with its image's generator, times the scaling factor: the clean latents.
at::Tensor encode_init_image(StableDiffusion& pipe, const at::Tensor& image, std::vector<at::Generator>& generators) {
  at::NoGradGuard no_grad;
  const models::DiagonalGaussian posterior = pipe.vae->encode(image.to(dtype_of(*pipe.vae)));
  std::vector<at::Tensor> samples;
  for (auto& g : generators) {
    // Drawn in float32 whatever the VAE's dtype, so a bf16 run sees the same random stream.
    const at::Tensor eps = at::randn(posterior.mean.sizes(), g, at::TensorOptions().dtype(at::kFloat));
    samples.push_back(posterior.sample(eps).to(at::kFloat));
  }
  return at::cat(samples) * pipe.vae->scaling_factor();
}

}  // namespace

at::Tensor preprocess_image(const io::RgbImage& image, int64_t multiple) {
  const auto m = static_cast<int>(multiple);
  const int width = image.width - image.width % m, height = image.height - image.height % m;
  SD_CHECK(width > 0 && height > 0, "init image of {}x{} is smaller than {} pixels, the VAE's scale factor",
           image.width, image.height, multiple);
  io::RgbImage sized = io::resize(image, width, height, io::ResizeFilter::kLanczos);
  const at::Tensor pixels =
      at::from_blob(sized.pixels.data(), {height, width, 3}, at::kByte).permute({2, 0, 1}).unsqueeze(0);
  return pixels.to(at::kFloat) / 255.0 * 2.0 - 1.0;
}

at::Tensor img2img_timesteps(const schedulers::Scheduler& scheduler, int num_inference_steps, double strength) {
  const int t_start = std::max(num_inference_steps - steps_to_run(num_inference_steps, strength), 0);
  return scheduler.timesteps().slice(0, static_cast<int64_t>(t_start) * scheduler.order());
}

void check_img2img_options(const Img2ImgOptions& o, const schedulers::Scheduler& scheduler) {
  check_generation_options(o, scheduler);
  SD_CHECK(o.strength > 0 && o.strength <= 1, "strength must be in (0, 1], got {}", o.strength);
  SD_CHECK(steps_to_run(o.num_inference_steps, o.strength) >= 1,
           "strength {} of {} inference steps runs no step (int(steps x strength) = 0): raise either", o.strength,
           o.num_inference_steps);
}

GenerationResult img2img(StableDiffusion& pipe, schedulers::Scheduler& scheduler, const Img2ImgOptions& o,
                         const GenerationHooks& hooks) {
  check_img2img_options(o, scheduler);
  const int64_t n = static_cast<int64_t>(o.prompts.size()) * o.num_images_per_prompt;
  prepare_scheduler(scheduler, o);
  const at::Tensor timesteps = img2img_timesteps(scheduler, o.num_inference_steps, o.strength);

  // diffusers' img2img pipeline has no guidance_rescale.
  const Guidance guidance{o.guidance_scale, 0.0};
  GenerationResult result;
  result.encoder_hidden_states = encode_prompt(pipe, o, guidance.enabled());
  std::vector<at::Generator> generators = image_generators(o.seed, n);
  for (int64_t k = 0; k < n; ++k) result.seeds.push_back(o.seed + static_cast<uint64_t>(k));

  // Each generator draws the VAE sample first, then the noise, then any scheduler noise (diffusers' order).
  const at::Tensor clean = encode_init_image(pipe, preprocess_image(o.init_image, pipe.vae_scale_factor()), generators);
  const at::Tensor noise = randn_per_image(generators, clean.sizes().slice(1));
  at::Tensor latents = scheduler.add_noise(clean, noise, timesteps.slice(0, 0, 1).repeat({n}));
  latents = denoise(pipe, scheduler, latents, timesteps, result.encoder_hidden_states, guidance, generators, hooks);
  result.images = decode_latents(pipe, latents);
  result.images_uint8 = to_uint8(result.images);
  return result;
}

}  // namespace sd::pipeline
