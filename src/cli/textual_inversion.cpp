// `sdtrain textual-inversion`: the flags of diffusers' examples/textual_inversion/textual_inversion.py, same names
// and defaults, so `accelerate launch textual_inversion.py ARGS` becomes `sdtrain textual-inversion ARGS`.
#include "cli/commands.h"
#include "cli/flags.h"
#include "train/tasks/textual_inversion.h"

namespace sd::cli {

void add_textual_inversion(CLI::App& app, std::function<int()>& chosen) {
  auto* cmd = app.add_subcommand("textual-inversion", "Learn the embedding of a new token from a few images");
  auto o = std::make_shared<train::TextualInversionOptions>();

  flag(cmd, "--pretrained_model_name_or_path", o->pretrained_model_name_or_path,
       "Pipeline folder in the diffusers layout")
      ->required();
  flag(cmd, "--tokenizer_name", o->tokenizer_name, "Tokenizer folder, if not the pipeline's tokenizer/");
  flag(cmd, "--train_data_dir", o->train_data_dir, "Folder of training images (jpg, jpeg, png, bmp)")->required();
  flag(cmd, "--learnable_property", o->learnable_property, "What the token learns: object or style")
      ->check(CLI::IsMember({"object", "style"}));
  flag(cmd, "--placeholder_token", o->placeholder_token, "The new token, e.g. \"<dicoo>\"")->required();
  flag(cmd, "--initializer_token", o->initializer_token, "A single existing token whose embedding starts it")
      ->required();
  flag(cmd, "--num_vectors", o->num_vectors, "Embedding vectors per concept")->check(CLI::PositiveNumber);
  flag(cmd, "--repeats", o->repeats, "How many times each image repeats per epoch")->check(CLI::PositiveNumber);
  flag(cmd, "--resolution", o->resolution, "Training image size")->check(CLI::PositiveNumber);
  switch_flag(cmd, "--center_crop", o->center_crop, "Center-crop images to a square before resizing");
  flag(cmd, "--train_batch_size", o->train_batch_size, "Images per rank per micro-batch")->check(CLI::PositiveNumber);
  flag(cmd, "--num_train_epochs", o->num_train_epochs, "Epochs, used when --max_train_steps is not given");
  flag(cmd, "--max_train_steps", o->max_train_steps,
       "Optimizer steps (default 5000, as the reference); overrides --num_train_epochs")
      ->check(CLI::PositiveNumber);
  flag(cmd, "--gradient_accumulation_steps", o->gradient_accumulation_steps, "Micro-batches per optimizer step")
      ->check(CLI::PositiveNumber);
  switch_flag(cmd, "--gradient_checkpointing", o->gradient_checkpointing,
              "Recompute UNet activations in backward to save memory");
  flag(cmd, "--learning_rate", o->learning_rate, "Learning rate after warmup");
  switch_flag(cmd, "--scale_lr", o->scale_lr,
              "Multiply the learning rate by accumulation steps x batch size x world size");
  flag(cmd, "--lr_scheduler", o->lr_scheduler, "LR schedule")
      ->check(CLI::IsMember(
          {"linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"}));
  flag(cmd, "--lr_warmup_steps", o->lr_warmup_steps, "Warmup steps of the LR schedule");
  flag(cmd, "--lr_num_cycles", o->lr_num_cycles, "Hard restarts of cosine_with_restarts");
  flag(cmd, "--adam_beta1", o->adam_beta1, "AdamW beta1");
  flag(cmd, "--adam_beta2", o->adam_beta2, "AdamW beta2");
  flag(cmd, "--adam_weight_decay", o->adam_weight_decay, "AdamW decoupled weight decay");
  flag(cmd, "--adam_epsilon", o->adam_epsilon, "AdamW epsilon");
  flag(cmd, "--seed", o->seed, "Seed for reproducible training (random if not given)");
  flag(cmd, "--mixed_precision", o->mixed_precision,
       "bf16 runs the frozen UNet and VAE in bfloat16; fp16 is taken as bf16 on CPU")
      ->check(CLI::IsMember({"no", "fp16", "bf16"}));
  flag(cmd, "--output_dir", o->output_dir, "Where embeddings, checkpoints and logs go");
  flag(cmd, "--save_steps", o->save_steps, "Write learned_embeds-steps-N every N steps")->check(CLI::PositiveNumber);
  switch_flag(cmd, "--save_as_full_pipeline", o->save_as_full_pipeline,
              "Also write the whole pipeline with the extended tokenizer and text encoder");
  switch_flag(cmd, "--no_safe_serialization", o->no_safe_serialization,
              "Write learned_embeds*.bin (torch.save format) instead of safetensors");
  flag(cmd, "--checkpointing_steps", o->checkpointing_steps, "Write a resumable checkpoint-N every N steps")
      ->check(CLI::PositiveNumber);
  flag(cmd, "--checkpoints_total_limit", o->checkpoints_total_limit, "Keep at most this many checkpoints");
  flag(cmd, "--resume_from_checkpoint", o->resume_from_checkpoint, "A checkpoint-N folder, or 'latest'");
  flag(cmd, "--validation_prompt", o->validation_prompt, "Prompt for validation images");
  flag(cmd, "--num_validation_images", o->num_validation_images, "Validation images per validation");
  flag(cmd, "--validation_steps", o->validation_steps, "Validate every N steps")->check(CLI::PositiveNumber);
  flag(cmd, "--logging_dir", o->logging_dir, "Metrics log folder, relative to --output_dir");
  flag(cmd, "--report_to", o->report_to, "Accepted; sdtrain writes JSON-lines metrics to --logging_dir");
  flag(cmd, "--dataloader_num_workers", o->dataloader_num_workers,
       "Accepted; images are decoded once and cached, so no workers are needed");
  flag(cmd, "--threads", o->threads, "Intra-op threads of this rank (default: cores / ranks on this node)");
  flag(cmd, "--dist_timeout", o->dist_timeout_s, "Seconds before a lost or hung peer ends the run");
  flag(cmd, "--dist_iface", o->dist_iface, "Network interface for collectives (else GLOO_SOCKET_IFNAME)");

  accepted_python_flag(cmd, "--push_to_hub", false, "sdtrain never uploads; copy --output_dir yourself");
  accepted_python_flag(cmd, "--hub_token", true, "sdtrain never uploads; ignored");
  accepted_python_flag(cmd, "--hub_model_id", true, "sdtrain never uploads; ignored");
  accepted_python_flag(cmd, "--revision", true, "sdtrain reads local folders only; ignored");
  accepted_python_flag(cmd, "--variant", true, "sdtrain reads local folders only; ignored");
  accepted_python_flag(cmd, "--enable_xformers_memory_efficient_attention", false,
                       "xformers is CUDA-only; sdtrain uses its own attention");
  accepted_python_flag(cmd, "--allow_tf32", false, "TF32 is a CUDA setting; ignored on CPU");
  accepted_python_flag(cmd, "--local_rank", true, "ranks come from the launcher's environment");
  accepted_python_flag(cmd, "--validation_epochs", true, "deprecated in the reference too; use --validation_steps");

  cmd->callback([o, &chosen] { chosen = [o] { return train::run_textual_inversion(*o); }; });
}

}  // namespace sd::cli
