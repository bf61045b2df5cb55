// Text-to-image sampling as diffusers 0.24's StableDiffusionPipeline.__call__ computes it on the default path:
// prompt encoding, classifier-free guidance in one batch, the scheduler loop over the UNet, VAE decode, and the
// float32 NHWC images of output_type="np" (plus the uint8 pixels numpy_to_pil saves).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/image.h"
#include "pipeline/stable_diffusion.h"
#include "schedulers/scheduler.h"

namespace sd::pipeline {

struct Txt2ImgOptions {
  std::vector<std::string> prompts;
  std::string negative_prompt;  // for every prompt; "" is what diffusers uses when there is none
  int num_inference_steps = 50;
  double guidance_scale = 7.5;  // <= 1 runs the conditional half only, as diffusers does
  int64_t height = 0;           // 0: unet sample_size * vae_scale_factor, like diffusers
  int64_t width = 0;
  int64_t num_images_per_prompt = 1;
  // Image k (= prompt index * num_images_per_prompt + image index) draws its initial latents and any scheduler
  // noise from its own CPU generator seeded with seed + k: diffusers' generator=[torch.Generator().manual_seed(
  // seed + k) for k in range(N)], so each image is reproducible alone (seed + k with one prompt and one image).
  uint64_t seed = 0;
  // [N, latent_channels, height/f, width/f] float: start from these instead of the random draw (still multiplied
  // by the scheduler's init_noise_sigma, as diffusers does with `latents=`).
  at::Tensor initial_latents;
};

// What one denoising step saw, for tests and debugging (references, not copies).
struct Txt2ImgStep {
  int index = 0;
  at::Tensor timestep;       // 0-dim, the scheduler's dtype
  at::Tensor unet_input;     // [2N or N, C, h, w] after scale_model_input (uncond half first), float32
  at::Tensor unet_output;    // same shape, float32
  at::Tensor latents_after;  // [N, C, h, w] after scheduler.step
};

struct Txt2ImgHooks {
  std::function<void(const Txt2ImgStep&)> on_step;
  std::function<void(int done, int total)> on_progress;  // after each step
};

struct Txt2ImgResult {
  at::Tensor encoder_hidden_states;  // [2N or N, L, D] as fed to the UNet (negative first), float32
  at::Tensor images;                 // [N, H, W, 3] float32 in [0, 1]
  at::Tensor images_uint8;           // [N, H, W, 3] uint8 = round(images * 255)
  std::vector<uint64_t> seeds;       // per image: the generator seed it used
};

// Height and width the pipeline produces for `options` (0 -> the UNet's sample_size times the VAE factor).
std::pair<int64_t, int64_t> resolve_image_size(const StableDiffusion& pipe, const Txt2ImgOptions& options);

// The text encoder's last_hidden_state of `prompts` after maybe_convert_prompt: [P, L, D] in the encoder's dtype.
at::Tensor encode_prompts(StableDiffusion& pipe, const std::vector<std::string>& prompts);

// latents [N, C, h, w] (unscaled, as the sampler leaves them) -> [N, H, W, 3] float32 in [0, 1]. Runs the VAE in
// its own dtype.
at::Tensor decode_latents(StableDiffusion& pipe, const at::Tensor& latents);

// round(images * 255) as uint8 (numpy_to_pil): images [N, H, W, 3] float in [0, 1].
at::Tensor to_uint8(const at::Tensor& images);

// One uint8 image [H, W, 3] as an RgbImage (for save_png).
io::RgbImage to_rgb_image(const at::Tensor& pixels);

// The whole pipeline call. The UNet and VAE run in whatever dtype their weights have (bf16 included); latents,
// guidance and the scheduler arithmetic stay float32, cast at the UNet/VAE boundary. `scheduler` is reset with
// set_timesteps. Throws sd::Error on a size the VAE cannot divide, bad initial latents, steps < 1.
Txt2ImgResult txt2img(StableDiffusion& pipe, schedulers::Scheduler& scheduler, const Txt2ImgOptions& options,
                      const Txt2ImgHooks& hooks = {});

}  // namespace sd::pipeline
