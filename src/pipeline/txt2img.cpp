#include "pipeline/txt2img.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include "core/error.h"
#include "pipeline/textual_inversion_embeddings.h"

namespace sd::pipeline {

namespace {

// The schedulers whose step draws noise: DDPM (t > 0), EulerAncestral and the SDE variants of DPM-Solver.
// EulerDiscrete draws too in diffusers but never uses the draw (s_churn = 0), so its images do not depend on it.
bool step_draws_noise(const schedulers::Scheduler& scheduler) {
  const std::string cls = scheduler.class_name();
  if (cls == "DDPMScheduler" || cls == "EulerAncestralDiscreteScheduler") return true;
  return cls == "DPMSolverMultistepScheduler" && scheduler.config().algorithm_type.rfind("sde-", 0) == 0;
}

// One [1, ...] draw per image from its own generator, stacked: diffusers' randn_tensor with a list of generators.
at::Tensor randn_per_image(std::vector<at::Generator>& generators, at::IntArrayRef image_shape) {
  std::vector<at::Tensor> draws;
  draws.reserve(generators.size());
  std::vector<int64_t> shape{1};
  shape.insert(shape.end(), image_shape.begin(), image_shape.end());
  for (auto& g : generators) draws.push_back(at::randn(shape, g, at::TensorOptions().dtype(at::kFloat)));
  return at::cat(draws);
}

at::ScalarType dtype_of(torch::nn::Module& module) {
  for (const auto& p : module.parameters()) return p.scalar_type();
  return at::kFloat;
}

}  // namespace

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

at::Tensor encode_prompts(StableDiffusion& pipe, const std::vector<std::string>& prompts) {
  at::NoGradGuard no_grad;
  const auto length = static_cast<int64_t>(pipe.tokenizer.model_max_length());
  std::vector<int64_t> ids;
  for (const std::string& prompt : prompts) {
    std::vector<int64_t> row = pipe.tokenizer.encode(maybe_convert_prompt(prompt, pipe.tokenizer));
    SD_CHECK(static_cast<int64_t>(row.size()) == length, "tokenizer returned {} ids, expected {}", row.size(), length);
    ids.insert(ids.end(), row.begin(), row.end());
  }
  at::Tensor input_ids = at::tensor(ids, at::kLong).view({static_cast<int64_t>(prompts.size()), length});
  return pipe.text_encoder->forward(input_ids).last_hidden_state;  // [P, L, D]
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

Txt2ImgResult txt2img(StableDiffusion& pipe, schedulers::Scheduler& scheduler, const Txt2ImgOptions& o,
                      const Txt2ImgHooks& hooks) {
  SD_CHECK(!o.prompts.empty(), "no prompt given");
  SD_CHECK(o.num_images_per_prompt >= 1, "num_images_per_prompt must be >= 1, got {}", o.num_images_per_prompt);
  const auto [height, width] = resolve_image_size(pipe, o);
  const int64_t f = pipe.vae_scale_factor();
  const auto num_prompts = static_cast<int64_t>(o.prompts.size());
  const int64_t n = num_prompts * o.num_images_per_prompt;
  const int64_t channels = pipe.unet->config().in_channels;
  const std::vector<int64_t> latent_shape{channels, height / f, width / f};
  // set_timesteps validates the step count before any model runs.
  scheduler.set_timesteps(o.num_inference_steps);

  at::NoGradGuard no_grad;
  const bool guidance = o.guidance_scale > 1.0;
  const at::ScalarType unet_dtype = dtype_of(*pipe.unet);

  // Conditioning: each prompt's rows repeated num_images_per_prompt times (diffusers' repeat + view), the
  // negative prompt's rows first when guiding.
  at::Tensor cond = encode_prompts(pipe, o.prompts).repeat_interleave(o.num_images_per_prompt, 0);
  at::Tensor context = cond;
  if (guidance) {
    at::Tensor uncond = encode_prompts(pipe, {o.negative_prompt});
    context = at::cat({uncond.expand({n, uncond.size(1), uncond.size(2)}), cond});
  }
  Txt2ImgResult result;
  result.encoder_hidden_states = context.to(at::kFloat);
  context = context.to(unet_dtype);

  std::vector<at::Generator> generators;
  for (int64_t k = 0; k < n; ++k) {
    result.seeds.push_back(o.seed + static_cast<uint64_t>(k));
    generators.push_back(at::detail::createCPUGenerator(result.seeds.back()));
  }

  at::Tensor latents;
  if (o.initial_latents.defined()) {
    const at::Tensor& given = o.initial_latents;
    std::vector<int64_t> expected{n};
    expected.insert(expected.end(), latent_shape.begin(), latent_shape.end());
    SD_CHECK(given.sizes() == at::IntArrayRef(expected),
             "initial latents have shape [{}] but {} image(s) of {}x{} need [{}]", fmt::join(given.sizes(), ", "), n,
             width, height, fmt::join(expected, ", "));
    SD_CHECK(given.is_floating_point(), "initial latents must be floating point");
    latents = given.to(at::kFloat);
  } else {
    latents = randn_per_image(generators, latent_shape);
  }
  latents = latents * scheduler.init_noise_sigma();

  const bool draws_noise = step_draws_noise(scheduler);
  const at::Tensor timesteps = scheduler.timesteps();
  const int total = static_cast<int>(timesteps.size(0));
  for (int i = 0; i < total; ++i) {
    const at::Tensor t = timesteps[i];
    at::Tensor model_input = scheduler.scale_model_input(guidance ? at::cat({latents, latents}) : latents, t);
    at::Tensor noise_pred = pipe.unet->forward(model_input.to(unet_dtype), t, context).to(at::kFloat);
    at::Tensor guided = noise_pred;
    if (guidance) {
      auto halves = noise_pred.chunk(2);
      guided = halves[0] + o.guidance_scale * (halves[1] - halves[0]);
    }
    schedulers::Noise noise;
    if (draws_noise) noise = schedulers::Noise(randn_per_image(generators, latent_shape));
    latents = scheduler.step(guided, t, latents, noise);
    if (hooks.on_step) hooks.on_step({i, t, model_input, noise_pred, latents});
    if (hooks.on_progress) hooks.on_progress(i + 1, total);
  }

  result.images = decode_latents(pipe, latents);
  result.images_uint8 = to_uint8(result.images);
  return result;
}

}  // namespace sd::pipeline
