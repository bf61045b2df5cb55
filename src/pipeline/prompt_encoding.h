// The text conditioning of diffusers 0.24's encode_prompt: each prompt's text-encoder rows (clip-skipped on
// request) repeated per image, and with classifier-free guidance the negative prompts' rows first.
#pragma once
#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

#include "pipeline/generation.h"
#include "pipeline/stable_diffusion.h"

namespace sd::pipeline {

// The text encoder's output for `prompts` after maybe_convert_prompt: last_hidden_state, or with clip_skip the
// hidden state clip_skip layers before the last, through final_layer_norm. [P, L, D] in the encoder's dtype.
// clip_skip beyond the encoder's layer count throws sd::Error.
at::Tensor encode_text(StableDiffusion& pipe, const std::vector<std::string>& prompts,
                       std::optional<int> clip_skip = std::nullopt);

// The UNet's encoder_hidden_states for a run, float32: [N, L, D] (N = prompts x num_images_per_prompt, each
// prompt's rows repeated per image), or with guidance [2N, L, D] with the negative prompts' rows first. As in
// diffusers 0.24, clip_skip applies to the prompts only: negative prompts always use last_hidden_state.
at::Tensor encode_prompt(StableDiffusion& pipe, const GenerationOptions& options, bool guidance);

}  // namespace sd::pipeline
