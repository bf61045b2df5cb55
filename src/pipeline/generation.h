// What txt2img and img2img share, as diffusers 0.24's StableDiffusionPipeline and StableDiffusionImg2ImgPipeline
// share it: the call arguments both take, one generator per image, the denoising loop with classifier-free
// guidance, and the VAE decode to the float32 NHWC images of output_type="np" (plus the uint8 pixels
// numpy_to_pil saves).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "io/image.h"
#include "pipeline/stable_diffusion.h"
#include "schedulers/scheduler.h"

namespace sd::pipeline {

struct GenerationOptions {
  std::vector<std::string> prompts;
  // One per prompt, or one for every prompt; none means "" for each (what diffusers uses). Only the
  // unconditional half of guidance reads them.
  std::vector<std::string> negative_prompts;
  int num_inference_steps = 50;
  double guidance_scale = 7.5;  // <= 1 runs the conditional half only, as diffusers does
  int64_t num_images_per_prompt = 1;
  // Image k (= prompt index * num_images_per_prompt + image index) draws everything random (initial latents,
  // img2img's VAE sample and noise, scheduler noise) from its own CPU generator seeded with seed + k: diffusers'
  // generator=[torch.Generator().manual_seed(seed + k) for k in range(N)], so each image is reproducible alone
  // (seed + k with one prompt and one image).
  uint64_t seed = 0;
  // DDIM's eta in [0, 1]: the weight of the variance noise in each step (0 = deterministic DDIM). Other
  // schedulers have none (diffusers silently ignores it there; here a non-zero eta is an error).
  double eta = 0.0;
  // Skip this many text-encoder layers from the end (diffusers' clip_skip): the prompt rows are
  // final_layer_norm(hidden_states[-(clip_skip + 1)]). 0 is the same as none.
  std::optional<int> clip_skip;
  // diffusers' prompt_embeds= and negative_prompt_embeds=: [P, L, D] text-encoder rows of the P prompts (and of their
  // negative prompts) used instead of encoding them, e.g. by a training run that encoded its prompts once and
  // released the text encoder. Each is given or not independently; clip_skip does not apply to given rows.
  at::Tensor prompt_embeds;
  at::Tensor negative_prompt_embeds;
};

// What one denoising step saw, for tests and debugging (references, not copies).
struct DenoisingStep {
  int index = 0;
  at::Tensor timestep;       // 0-dim, the scheduler's dtype
  at::Tensor unet_input;     // [2N or N, C, h, w] after scale_model_input (uncond half first), float32
  at::Tensor unet_output;    // same shape, float32
  at::Tensor latents_after;  // [N, C, h, w] after scheduler.step
};

struct GenerationHooks {
  std::function<void(const DenoisingStep&)> on_step;
  std::function<void(int done, int total)> on_progress;  // after each step
};

struct GenerationResult {
  at::Tensor encoder_hidden_states;  // [2N or N, L, D] as fed to the UNet (negative first), float32
  at::Tensor images;                 // [N, H, W, 3] float32 in [0, 1]
  at::Tensor images_uint8;           // [N, H, W, 3] uint8 = round(images * 255)
  std::vector<uint64_t> seeds;       // per image: the generator seed it used
};

// Throws sd::Error for options no run can use: no prompt, a negative-prompt count that is neither 1 nor the
// prompt count, num_images_per_prompt or num_inference_steps < 1, eta outside [0, 1] or non-zero with a
// scheduler other than DDIM, a negative clip_skip. Cheap: the CLI calls it before loading weights.
void check_generation_options(const GenerationOptions& options, const schedulers::Scheduler& scheduler);

// set_timesteps and DDIM's eta, as the pipelines prepare the scheduler for a run.
void prepare_scheduler(schedulers::Scheduler& scheduler, const GenerationOptions& options);

// The generators of a run's images: image k seeded seed + k.
std::vector<at::Generator> image_generators(uint64_t seed, int64_t num_images);
// One float32 [1, ...shape] draw per image from its own generator, stacked to [N, ...shape]: diffusers'
// randn_tensor with a list of generators.
at::Tensor randn_per_image(std::vector<at::Generator>& generators, at::IntArrayRef shape);

// diffusers' rescale_noise_cfg (arXiv 2305.08891, section 3.4): the guided prediction rescaled to the standard
// deviation of the text-conditioned one, per image, then mixed back with weight guidance_rescale. Fixes
// over-exposure with zero-terminal-SNR models. noise_cfg, noise_pred_text: [N, ...].
at::Tensor rescale_noise_cfg(const at::Tensor& noise_cfg, const at::Tensor& noise_pred_text, double guidance_rescale);

// Classifier-free guidance as the pipelines apply it in every step.
struct Guidance {
  double scale = 7.5;    // <= 1: no guidance (the UNet sees the conditional batch alone)
  double rescale = 0.0;  // rescale_noise_cfg's weight; 0 leaves the guided prediction as it is
  bool enabled() const { return scale > 1.0; }
};

// The denoising loop of both pipelines over `timesteps` (a slice of the scheduler's table): scale_model_input,
// the UNet on [latents; latents] with `context` [2N, L, D] (or latents alone), guidance, then scheduler.step with
// a noise draw from each image's generator when the step takes one. latents: [N, C, h, w] float32. The UNet runs
// in its weights' dtype; latents, guidance and the scheduler arithmetic stay float32.
at::Tensor denoise(StableDiffusion& pipe, schedulers::Scheduler& scheduler, at::Tensor latents,
                   const at::Tensor& timesteps, const at::Tensor& context, const Guidance& guidance,
                   std::vector<at::Generator>& generators, const GenerationHooks& hooks);

// latents [N, C, h, w] (unscaled, as the sampler leaves them) -> [N, H, W, 3] float32 in [0, 1]. Runs the VAE in
// its own dtype.
at::Tensor decode_latents(StableDiffusion& pipe, const at::Tensor& latents);

// round(images * 255) as uint8 (numpy_to_pil): images [N, H, W, 3] float in [0, 1].
at::Tensor to_uint8(const at::Tensor& images);

// One uint8 image [H, W, 3] as an RgbImage (for save_png).
io::RgbImage to_rgb_image(const at::Tensor& pixels);

// The dtype of a module's parameters (float32 for a module without any).
at::ScalarType dtype_of(torch::nn::Module& module);

}  // namespace sd::pipeline
