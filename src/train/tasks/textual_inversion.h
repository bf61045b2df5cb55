// Textual inversion as diffusers' examples/textual_inversion/textual_inversion.py does it: learn the embedding of
// new placeholder token(s) with the UNet, VAE and the rest of the text encoder frozen. A task on the training
// engine (train/trainer.h); this file holds only what is particular to it.
#pragma once
#include <optional>
#include <string>

#include "models/unet/unet_memory_options.h"
#include "pipeline/model_source.h"
#include "train/trainer.h"

namespace sd::train {

// The flags of the reference script beyond the engine's, with its defaults. Field names are the flag names.
struct TextualInversionOptions {
  TrainerOptions training;
  pipeline::ModelRequest model;  // --pretrained_model_name_or_path, --revision, --variant, --config_from
  std::string tokenizer_name;
  std::string train_data_dir;
  std::string learnable_property = "object";
  std::string placeholder_token;
  std::string initializer_token;
  int num_vectors = 1;
  int repeats = 100;
  int resolution = 512;
  bool center_crop = false;
  models::UNetMemoryOptions unet_memory;  // --gradient_checkpointing[_levels], --memory_efficient_attention
  int64_t save_steps = 500;
  bool save_as_full_pipeline = false;
  bool no_safe_serialization = false;
  std::string validation_prompt;
  int num_validation_images = 4;
  int64_t validation_steps = 100;
  int dataloader_num_workers = 0;

  // The reference script's defaults for the engine's flags.
  TextualInversionOptions();
};

// Runs the whole training; returns the process exit code.
int run_textual_inversion(const TextualInversionOptions& options);

}  // namespace sd::train
