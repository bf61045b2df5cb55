// `sdtrain textual-inversion`: the flags of diffusers' examples/textual_inversion/textual_inversion.py, same names
// and defaults, so `accelerate launch textual_inversion.py ARGS` becomes `sdtrain textual-inversion ARGS`.
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_flags.h"
#include "cli/training_flags.h"
#include "train/tasks/textual_inversion.h"

namespace sd::cli {

void add_textual_inversion(CLI::App& app, std::function<int()>& chosen) {
  auto* cmd = app.add_subcommand("textual-inversion", "Learn the embedding of a new token from a few images");
  auto o = std::make_shared<train::TextualInversionOptions>();

  const std::string task = "Textual inversion";
  add_model_flags(cmd, "--pretrained_model_name_or_path", o->model, task)->required();
  flag(cmd, "--tokenizer_name", o->tokenizer_name, "Tokenizer folder, if not the pipeline's tokenizer/")->group(task);
  flag(cmd, "--train_data_dir", o->train_data_dir, "Folder of training images (jpg, jpeg, png, bmp)")
      ->required()
      ->group(task);
  flag(cmd, "--learnable_property", o->learnable_property, "What the token learns: object or style")
      ->check(CLI::IsMember({"object", "style"}))
      ->group(task);
  flag(cmd, "--placeholder_token", o->placeholder_token, "The new token, e.g. \"<dicoo>\"")->required()->group(task);
  flag(cmd, "--initializer_token", o->initializer_token, "A single existing token whose embedding starts it")
      ->required()
      ->group(task);
  flag(cmd, "--num_vectors", o->num_vectors, "Embedding vectors per concept")->check(in_range(1, 256))->group(task);
  flag(cmd, "--repeats", o->repeats, "How many times each image repeats per epoch")
      ->check(in_range(1, 1000000))
      ->group(task);
  flag(cmd, "--resolution", o->resolution, "Training image size")->check(in_range(8, 16384))->group(task);
  switch_flag(cmd, "--center_crop", o->center_crop, "Center-crop images to a square before resizing")->group(task);
  add_unet_memory_flags(cmd, o->unet_memory, task);
  flag(cmd, "--save_steps", o->save_steps, "Write learned_embeds-steps-N every N steps")
      ->check(at_least(1))
      ->group(task);
  switch_flag(cmd, "--save_as_full_pipeline", o->save_as_full_pipeline,
              "Also write the whole pipeline with the extended tokenizer and text encoder")
      ->group(task);
  switch_flag(cmd, "--no_safe_serialization", o->no_safe_serialization,
              "Write learned_embeds*.bin (torch.save format) instead of safetensors")
      ->group(task);
  flag(cmd, "--validation_prompt", o->validation_prompt, "Prompt for validation images")->group(task);
  flag(cmd, "--num_validation_images", o->num_validation_images, "Validation images per validation")
      ->check(in_range(1, 64))
      ->group(task);
  flag(cmd, "--validation_steps", o->validation_steps, "Validate every N steps")->check(at_least(1))->group(task);
  flag(cmd, "--dataloader_num_workers", o->dataloader_num_workers,
       "Accepted; images are decoded once and cached, so no workers are needed")
      ->group(task);

  add_trainer_flags(cmd, o->training);
  add_python_only_training_flags(cmd);
  accepted_python_flag(cmd, "--validation_epochs", true, "deprecated in the reference too; use --validation_steps");

  cmd->callback([cmd, o, &chosen] {
    record_command_line(cmd, o->training);
    chosen = [o] { return train::run_textual_inversion(*o); };
  });
}

}  // namespace sd::cli
