// UNet training as diffusers' examples/text_to_image/train_text_to_image.py does it (fine-tuning, or pretraining
// from the UNet config's initialisation as MosaicML's benchmark does): the VAE and text encoder frozen, every UNet
// parameter trained (and, for DreamBooth's --train_text_encoder, every text-encoder parameter too). A task on the
// training engine (train/trainer.h).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "data/training_data.h"
#include "models/unet/unet_memory_options.h"
#include "pipeline/model_source.h"
#include "train/trainer.h"

namespace sd::train {

// The reference script's flags beyond the engine's, with its defaults, plus sdtrain's data and initialisation
// options. Field names are the flag names.
struct UNetTrainingOptions {
  TrainerOptions training;
  data::TrainingDataOptions data;
  pipeline::ModelRequest model;           // --pretrained_model_name_or_path, --revision, --variant, --config_from
  models::UNetMemoryOptions unet_memory;  // --gradient_checkpointing[_levels], --memory_efficient_attention
  std::optional<double> snr_gamma;
  double noise_offset = 0;
  double input_perturbation = 0;
  bool dream_training = false;
  double dream_detail_preservation = 1.0;
  std::string prediction_type;                  // "" = the scheduler config's
  std::vector<std::string> validation_prompts;  // --validation_prompts, or the LoRA script's --validation_prompt
  int64_t num_validation_images = 1;            // per prompt
  int64_t validation_epochs = 5;
  std::optional<int64_t> validation_steps;          // DreamBooth's: every N steps instead (and no round after the last)
  std::optional<std::string> validation_scheduler;  // a scheduler name (schedulers/factory.h); none: the pipeline's
  int64_t validation_inference_steps = 20;          // not a flag: the script's 20, the LoRA script's 30
  bool from_scratch = false;                        // sdtrain's own: UNet weights from its config's initialisation
  bool train_text_encoder = false;                  // DreamBooth's: the whole text encoder trains with the UNet
  bool pre_compute_text_embeddings = false;         // DreamBooth's: its prompts encoded once, the encoder released

  // The reference script's defaults for the engine's flags.
  UNetTrainingOptions();
};

// Runs the whole training; returns the process exit code.
int run_unet_training(const UNetTrainingOptions& options);

}  // namespace sd::train
