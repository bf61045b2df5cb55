#include "pipeline/generation.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include "core/error.h"
#include "schedulers/ddim.h"

namespace sd::pipeline {

void check_generation_options(const GenerationOptions& o, const schedulers::Scheduler& scheduler) {
  SD_CHECK(!o.prompts.empty(), "no prompt given");
  const size_t negatives = o.negative_prompts.size();
  SD_CHECK(negatives <= 1 || negatives == o.prompts.size(),
           "negative_prompt given {} times for {} prompts: give one for every prompt or one per prompt", negatives,
           o.prompts.size());
  SD_CHECK(o.num_images_per_prompt >= 1, "num_images_per_prompt must be >= 1, got {}", o.num_images_per_prompt);
  SD_CHECK(o.num_inference_steps >= 1, "num_inference_steps must be >= 1, got {}", o.num_inference_steps);
  SD_CHECK(o.eta >= 0 && o.eta <= 1, "eta must be in [0, 1], got {}", o.eta);
  SD_CHECK(o.eta == 0 || dynamic_cast<const schedulers::DDIMScheduler*>(&scheduler),
           "eta {} needs the DDIM scheduler (scheduler ddim); {} takes no eta", o.eta, scheduler.class_name());
  SD_CHECK(!o.clip_skip || *o.clip_skip >= 0, "clip_skip must be >= 0, got {}", o.clip_skip.value_or(0));
  for (const auto& [name, embeds] :
       {std::pair{"prompt_embeds", &o.prompt_embeds}, std::pair{"negative_prompt_embeds", &o.negative_prompt_embeds}})
    SD_CHECK(!embeds->defined() || (embeds->dim() == 3 && embeds->size(0) == static_cast<int64_t>(o.prompts.size())),
             "{}: expected [{}, L, D] (one row block per prompt), got {}", name, o.prompts.size(),
             c10::str(embeds->sizes()));
  // As diffusers' check_inputs: the two halves of classifier-free guidance are concatenated row for row.
  SD_CHECK(!o.prompt_embeds.defined() || !o.negative_prompt_embeds.defined() ||
               o.prompt_embeds.sizes() == o.negative_prompt_embeds.sizes(),
           "negative_prompt_embeds {} must have the shape of prompt_embeds {}",
           c10::str(o.negative_prompt_embeds.sizes()), c10::str(o.prompt_embeds.sizes()));
}

void prepare_scheduler(schedulers::Scheduler& scheduler, const GenerationOptions& o) {
  scheduler.set_timesteps(o.num_inference_steps);
  if (auto* ddim = dynamic_cast<schedulers::DDIMScheduler*>(&scheduler)) ddim->set_eta(o.eta);
}

std::vector<at::Generator> image_generators(uint64_t seed, int64_t num_images) {
  std::vector<at::Generator> generators;
  for (int64_t k = 0; k < num_images; ++k) generators.push_back(at::detail::createCPUGenerator(seed + k));
  return generators;
}

at::Tensor randn_per_image(std::vector<at::Generator>& generators, at::IntArrayRef shape) {
  std::vector<int64_t> one_image{1};
  one_image.insert(one_image.end(), shape.begin(), shape.end());
  std::vector<at::Tensor> draws;
  for (auto& g : generators) draws.push_back(at::randn(one_image, g, at::TensorOptions().dtype(at::kFloat)));
  return at::cat(draws);
}

at::Tensor rescale_noise_cfg(const at::Tensor& noise_cfg, const at::Tensor& noise_pred_text, double guidance_rescale) {
  std::vector<int64_t> per_image_dims;
  for (int64_t d = 1; d < noise_cfg.dim(); ++d) per_image_dims.push_back(d);
  // torch.std's default: the unbiased estimate.
  const at::Tensor std_text = noise_pred_text.std(per_image_dims, /*unbiased=*/true, /*keepdim=*/true);
  const at::Tensor std_cfg = noise_cfg.std(per_image_dims, /*unbiased=*/true, /*keepdim=*/true);
  const at::Tensor rescaled = noise_cfg * (std_text / std_cfg);
  return guidance_rescale * rescaled + (1 - guidance_rescale) * noise_cfg;
}

at::Tensor denoise(StableDiffusion& pipe, schedulers::Scheduler& scheduler, at::Tensor latents,
                   const at::Tensor& timesteps, const at::Tensor& context, const Guidance& guidance,
                   std::vector<at::Generator>& generators, const GenerationHooks& hooks) {
  at::NoGradGuard no_grad;
  const at::ScalarType unet_dtype = dtype_of(*pipe.unet);
  const at::Tensor unet_context = context.to(unet_dtype);
  const int total = static_cast<int>(timesteps.size(0));
  for (int i = 0; i < total; ++i) {
    const at::Tensor t = timesteps[i];
    const at::Tensor model_input =
        scheduler.scale_model_input(guidance.enabled() ? at::cat({latents, latents}) : latents, t);
    const at::Tensor noise_pred = pipe.unet->forward(model_input.to(unet_dtype), t, unet_context).to(at::kFloat);
    at::Tensor guided = noise_pred;
    if (guidance.enabled()) {
      const auto halves = noise_pred.chunk(2);  // uncond, text
      guided = halves[0] + guidance.scale * (halves[1] - halves[0]);
      if (guidance.rescale > 0) guided = rescale_noise_cfg(guided, halves[1], guidance.rescale);
    }
    schedulers::Noise noise;
    if (scheduler.step_draws_noise()) noise = schedulers::Noise(randn_per_image(generators, latents.sizes().slice(1)));
    latents = scheduler.step(guided, t, latents, noise);
    if (hooks.on_step) hooks.on_step({i, t, model_input, noise_pred, latents});
    if (hooks.on_progress) hooks.on_progress(i + 1, total);
  }
  return latents;
}

at::Tensor decode_latents(StableDiffusion& pipe, const at::Tensor& latents) {
  at::NoGradGuard no_grad;
  const at::ScalarType vae_dtype = dtype_of(*pipe.vae);
  at::Tensor image = pipe.vae->decode((latents / pipe.vae->scaling_factor()).to(vae_dtype));  // [N, 3, H, W]
  image = (image.to(at::kFloat) / 2 + 0.5).clamp(0, 1);
  return image.permute({0, 2, 3, 1}).contiguous();  // [N, H, W, 3]
}

at::Tensor to_uint8(const at::Tensor& images) { return (images * 255).round().to(at::kByte); }

io::RgbImage to_rgb_image(const at::Tensor& pixels) {
  const at::Tensor c = pixels.contiguous();
  io::RgbImage image{static_cast<int>(c.size(1)), static_cast<int>(c.size(0)), {}};
  image.pixels.assign(c.data_ptr<uint8_t>(), c.data_ptr<uint8_t>() + c.numel());
  return image;
}

at::ScalarType dtype_of(torch::nn::Module& module) {
  for (const auto& p : module.parameters()) return p.scalar_type();
  return at::kFloat;
}

}  // namespace sd::pipeline
