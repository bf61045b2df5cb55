// Text-to-image sampling as diffusers 0.24's StableDiffusionPipeline.__call__ computes it on the default path:
// prompt encoding, classifier-free guidance in one batch (optionally rescaled), the scheduler loop over the UNet
// and the VAE decode (see generation.h for the parts img2img shares).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>

#include "pipeline/generation.h"
#include "pipeline/stable_diffusion.h"
#include "schedulers/scheduler.h"

namespace sd::pipeline {

struct Txt2ImgOptions : GenerationOptions {
  int64_t height = 0;  // 0: unet sample_size * vae_scale_factor, like diffusers
  int64_t width = 0;
  // [N, latent_channels, height/f, width/f] float: start from these instead of the random draw (still multiplied
  // by the scheduler's init_noise_sigma, as diffusers does with `latents=`).
  at::Tensor initial_latents;
  // rescale_noise_cfg's weight in [0, 1] (arXiv 2305.08891, section 3.4); used only with guidance.
  double guidance_rescale = 0.0;
};

// What txt2img's names were before img2img shared them.
using Txt2ImgStep = DenoisingStep;
using Txt2ImgHooks = GenerationHooks;
using Txt2ImgResult = GenerationResult;

// Height and width the pipeline produces for `options` (0 -> the UNet's sample_size times the VAE factor).
std::pair<int64_t, int64_t> resolve_image_size(const StableDiffusion& pipe, const Txt2ImgOptions& options);

// check_generation_options, plus guidance_rescale in [0, 1].
void check_txt2img_options(const Txt2ImgOptions& options, const schedulers::Scheduler& scheduler);

// The whole pipeline call. `scheduler` is reset with set_timesteps. Throws sd::Error on a size the VAE cannot
// divide, bad initial latents and the option errors above.
GenerationResult txt2img(StableDiffusion& pipe, schedulers::Scheduler& scheduler, const Txt2ImgOptions& options,
                         const GenerationHooks& hooks = {});

// txt2img with a progress bar labelled `label` (core/progress.h: redrawn on a terminal, a line now and then in a
// log), as training's validation runs it: minutes of denoising on a CPU should not look like a hang.
GenerationResult txt2img_with_progress(StableDiffusion& pipe, schedulers::Scheduler& scheduler,
                                       const Txt2ImgOptions& options, const std::string& label);

}  // namespace sd::pipeline
