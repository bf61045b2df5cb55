// Textual inversion as diffusers' examples/textual_inversion/textual_inversion.py does it: learn the embedding of
// new placeholder token(s) with the UNet, VAE and the rest of the text encoder frozen.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace sd::train {

// Every flag of the reference script, with its default. Field names are the flag names.
struct TextualInversionOptions {
  std::string pretrained_model_name_or_path;
  std::string tokenizer_name;
  std::string train_data_dir;
  std::string learnable_property = "object";
  std::string placeholder_token;
  std::string initializer_token;
  int num_vectors = 1;
  int repeats = 100;
  int resolution = 512;
  bool center_crop = false;
  int train_batch_size = 16;
  int num_train_epochs = 100;
  std::optional<int64_t> max_train_steps = 5000;
  int gradient_accumulation_steps = 1;
  bool gradient_checkpointing = false;
  double learning_rate = 1e-4;
  bool scale_lr = false;
  std::string lr_scheduler = "constant";
  int64_t lr_warmup_steps = 500;
  int lr_num_cycles = 1;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_weight_decay = 1e-2;
  double adam_epsilon = 1e-8;
  std::optional<uint64_t> seed;
  std::string mixed_precision = "no";  // no, fp16, bf16
  std::string output_dir = "text-inversion-model";
  int64_t save_steps = 500;
  bool save_as_full_pipeline = false;
  bool no_safe_serialization = false;
  int64_t checkpointing_steps = 500;
  std::optional<int> checkpoints_total_limit;
  std::string resume_from_checkpoint;
  std::string validation_prompt;
  int num_validation_images = 4;
  int64_t validation_steps = 100;
  std::string logging_dir = "logs";
  std::string report_to = "tensorboard";
  int dataloader_num_workers = 0;
  // sdtrain's own
  std::optional<int> threads;
  double dist_timeout_s = 300;
  std::string dist_iface;
};

// Runs the whole training; returns the process exit code.
int run_textual_inversion(const TextualInversionOptions& options);

}  // namespace sd::train
