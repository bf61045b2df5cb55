// Image-to-image as diffusers 0.24's StableDiffusionImg2ImgPipeline.__call__ computes it: the init image
// preprocessed as VaeImageProcessor does, encoded by the VAE and sampled (latent_dist.sample) with each image's
// generator, noised to the timestep `strength` of the way into the schedule, and denoised from there.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

#include "io/image.h"
#include "pipeline/generation.h"
#include "pipeline/stable_diffusion.h"
#include "schedulers/scheduler.h"

namespace sd::pipeline {

struct Img2ImgOptions : GenerationOptions {
  // The starting image, as PIL's Image.open(f).convert("RGB") gives it (io::load_image_rgb); the output has its
  // size rounded down to multiples of the VAE's scale factor. Every image of the run starts from it: diffusers
  // with the image repeated once per output image, so image k's VAE sample also comes from generator seed + k.
  io::RgbImage init_image;
  // In (0, 1]: the share of the schedule that runs, i.e. how far the result may move from the image.
  double strength = 0.8;
};

// VaeImageProcessor.preprocess of an RGB PIL image: width and height rounded down to multiples of `multiple`
// (a Lanczos resize when that changes them), then pixels / 255 * 2 - 1. Returns float32 [1, 3, H, W].
at::Tensor preprocess_image(const io::RgbImage& image, int64_t multiple);

// diffusers' get_timesteps: the tail of the (already set) table that img2img runs, after skipping
// n - int(n * strength) of the n inference steps, `order` table entries each.
at::Tensor img2img_timesteps(const schedulers::Scheduler& scheduler, int num_inference_steps, double strength);

// check_generation_options, plus strength in (0, 1] leaving at least one step.
void check_img2img_options(const Img2ImgOptions& options, const schedulers::Scheduler& scheduler);

// The whole pipeline call. `scheduler` is reset with set_timesteps.
GenerationResult img2img(StableDiffusion& pipe, schedulers::Scheduler& scheduler, const Img2ImgOptions& options,
                         const GenerationHooks& hooks = {});

}  // namespace sd::pipeline
