// UNet training as diffusers' examples/text_to_image/train_text_to_image.py does it (fine-tuning, or pretraining
// from the UNet config's initialisation as MosaicML's benchmark does): the VAE and text encoder frozen, every UNet
// parameter trained. A task on the training engine (train/trainer.h).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "pipeline/model_source.h"
#include "train/trainer.h"

namespace sd::train {

// The reference script's flags beyond the engine's, with its defaults, plus sdtrain's data and initialisation
// options. Field names are the flag names.
struct UNetTrainingOptions {
  TrainerOptions training;
  pipeline::ModelRequest model;  // --pretrained_model_name_or_path, --revision, --variant, --config_from
  std::string train_data_dir;
  std::string image_column = "image";
  std::string caption_column = "text";
  std::optional<int64_t> max_train_samples;
  int resolution = 512;
  bool center_crop = false;
  bool random_flip = false;
  bool gradient_checkpointing = false;
  std::optional<double> snr_gamma;
  double noise_offset = 0;
  double input_perturbation = 0;
  std::string prediction_type;  // "" = the scheduler config's
  std::vector<std::string> validation_prompts;
  int64_t validation_epochs = 5;
  int dataloader_num_workers = 0;
  // sdtrain's own
  bool from_scratch = false;           // UNet weights from its config's initialisation
  std::string synthetic_data;          // "", "images" or "latents"
  int64_t synthetic_samples = 100000;  // samples in one synthetic epoch
  std::string replay_inputs;           // a file of recorded inputs (see data/training_batches.h)

  // The reference script's defaults for the engine's flags.
  UNetTrainingOptions();
};

// Runs the whole training; returns the process exit code.
int run_unet_training(const UNetTrainingOptions& options);

}  // namespace sd::train
