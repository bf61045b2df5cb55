// LoRA training as diffusers' examples/text_to_image/train_text_to_image_lora.py does it: UNet training
// (train/tasks/unet_training.h, same data, noise, loss, validation and engine) with the UNet, and optionally the
// text encoder, frozen in the compute precision and only low-rank adapters on chosen layers trained (float32
// masters and AdamW state). Writes pytorch_lora_weights.safetensors (diffusers) and, with --lora_format kohya, a
// kohya/A1111 file too (pipeline/lora_file.h).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "train/tasks/unet_training.h"

namespace sd::train {

// Field names are the flag names; defaults are the diffusers script's (whose other differences from the full UNet
// script, --output_dir sd-model-finetuned-lora and its validation's defaults, the command line sets).
struct LoraTrainingOptions : UNetTrainingOptions {
  int64_t lora_rank = 4;
  std::optional<double> lora_alpha;  // unset: the rank (the adapters' outputs are not rescaled)
  // Layers to adapt, matched by the end of their module path as peft matches target_modules.
  std::vector<std::string> lora_target_modules = {"to_q", "to_k", "to_v", "to_out.0"};
  // Also adapt the text encoder's attention projections (q_proj, k_proj, v_proj, out_proj), as diffusers' DreamBooth
  // LoRA script's --train_text_encoder does.
  bool train_text_encoder_lora = false;
  std::string lora_format = "diffusers";  // "kohya": also write the kohya/A1111 file
};

// Runs the whole training; returns the process exit code.
int run_lora_training(const LoraTrainingOptions& options);

}  // namespace sd::train
