// `sdtrain dreambooth`: the flags of diffusers' examples/dreambooth/train_dreambooth.py (the whole UNet), same names
// and defaults, or with --rank those of train_dreambooth_lora.py (LoRA adapters): a subject's few images under one
// prompt, optionally kept from drifting by prior preservation on images of its class, which are generated first when
// --class_data_dir holds too few. Training itself is `sdtrain train`'s (train/tasks/unet_training.h).
#include "cli/commands.h"
#include "cli/data_flags.h"
#include "cli/flags.h"
#include "cli/model_flags.h"
#include "cli/training_flags.h"
#include "core/log.h"
#include "schedulers/factory.h"
#include "train/tasks/lora_training.h"

namespace sd::cli {

namespace {

// Gives a flag that was not given another default (the LoRA script's), shown as such in run.json.
template <typename T, typename U>
void use_default(CLI::Option* option, T& value, const U& fallback) {
  if (option->count() != 0) return;
  value = fallback;
  option->default_str(fmt::format("{}", fallback));
}

}  // namespace

void add_dreambooth(CLI::App& app, std::function<int()>& chosen) {
  auto* cmd = app.add_subcommand("dreambooth", "Teach the UNet (or LoRA adapters) a subject from a few images");
  auto o = std::make_shared<train::LoraTrainingOptions>();
  // The full script's defaults; --rank switches to the LoRA script's in the callback.
  o->training.output_dir = "dreambooth-model";
  o->training.train_batch_size = 4;
  o->training.learning_rate = 5e-6;
  o->data.transform.resolution = 512;
  o->num_validation_images = 4;
  o->validation_steps = 100;
  o->validation_inference_steps = 25;
  o->validation_scheduler = "DPMSolverMultistepScheduler";
  o->lora_target_modules = {"to_k", "to_q", "to_v", "to_out.0"};

  const std::string model = "Model";
  add_model_flags(cmd, "--pretrained_model_name_or_path", o->model, model)->required();
  add_unet_memory_flags(cmd, o->unet_memory, model);
  auto* pre_compute = switch_flag(cmd, "--pre_compute_text_embeddings", o->pre_compute_text_embeddings,
                                  "Encode the prompts once before training and release the text encoder (its "
                                  "memory and each step's encoding saved)")
                          ->group(model);
  switch_flag(cmd, "--train_text_encoder", o->train_text_encoder,
              "Train the whole text encoder with the UNet (float32 masters, as the UNet's); with --rank, LoRA "
              "adapters on its q_proj, k_proj, v_proj and out_proj")
      ->group(model);

  data::DreamBoothDataOptions& d = o->data.dreambooth;
  const std::string data = "Instance and class images";
  flag(cmd, "--instance_data_dir", d.instance_data_dir, "Folder of the subject's images")->required()->group(data);
  flag(cmd, "--instance_prompt", d.instance_prompt, "Their prompt, naming the subject, e.g. \"a photo of sks dog\"")
      ->required()
      ->group(data);
  switch_flag(cmd, "--with_prior_preservation", d.with_prior_preservation,
              "Train each batch's instance images beside as many class images, so the model keeps what the class "
              "looks like")
      ->group(data);
  flag(cmd, "--class_data_dir", d.class_data_dir,
       "Folder of class images; the pipeline generates the missing ones into it first")
      ->group(data);
  flag(cmd, "--class_prompt", d.class_prompt, "Prompt of the class images, e.g. \"a photo of dog\"")->group(data);
  flag(cmd, "--prior_loss_weight", o->data.prior_loss_weight,
       "Weight of the class images' loss: mse(instances) + w * mse(classes)")
      ->check(non_negative_number())
      ->group(data);
  flag(cmd, "--num_class_images", d.num_class_images, "Class images to train on (generated up to this many)")
      ->check(at_least(1))
      ->group(data);
  flag(cmd, "--sample_batch_size", d.sample_batch_size, "Class images generated per pipeline call")
      ->check(in_range(1, 1024))
      ->group(data);
  flag(cmd, "--prior_generation_precision", d.prior_generation_precision,
       "Precision of the pipeline generating them: fp32 or bf16 (fp16 is taken as bf16); default: --mixed_precision's")
      ->check(CLI::IsMember({"no", "fp32", "fp16", "bf16"}))
      ->group(data);
  flag(cmd, "--resolution", o->data.transform.resolution, "Training image size")
      ->check(in_range(8, 16384))
      ->group(data);
  switch_flag(cmd, "--center_crop", o->data.transform.center_crop, "Center-crop after resizing (default: random crop)")
      ->group(data);
  add_interpolation_flag(cmd, o->data.transform, data);
  flag(cmd, "--dataloader_num_workers", o->data.dataloader_num_workers, "Loader threads decoding images ahead of use")
      ->check(in_range(0, 256))
      ->group(data);

  const std::string loss = "Loss";
  flag(cmd, "--snr_gamma", o->snr_gamma,
       "Min-SNR loss weighting gamma (5.0 is recommended); weighs the class images' loss too, as kohya does")
      ->group(loss);
  auto offset_noise = std::make_shared<bool>(false);
  switch_flag(cmd, "--offset_noise", *offset_noise, "Offset noise of scale 0.1 (per image and channel)")->group(loss);

  const std::string validation = "Validation";
  auto validation_prompt = std::make_shared<std::string>();
  flag(cmd, "--validation_prompt", *validation_prompt, "Prompt to generate --num_validation_images images for")
      ->group(validation);
  flag(cmd, "--num_validation_images", o->num_validation_images, "Images per validation")
      ->check(in_range(1, 64))
      ->group(validation);
  auto* validation_steps = flag(cmd, "--validation_steps", *o->validation_steps, "Validate every N steps")
                               ->check(at_least(1))
                               ->group(validation);
  auto* validation_epochs = flag(cmd, "--validation_epochs", o->validation_epochs,
                                 "Validate every N epochs instead, and after the last step (the LoRA script's way, "
                                 "default 50 with --rank)")
                                ->check(at_least(1))
                                ->excludes(validation_steps)
                                ->group(validation);
  flag(cmd, "--validation_scheduler", *o->validation_scheduler, "Scheduler of the validation images (25 steps)")
      ->check(CLI::IsMember(schedulers::scheduler_names()))
      ->group(validation);

  const std::string lora = "LoRA (diffusers' train_dreambooth_lora.py; see docs/lora.md)";
  auto* rank = flag(cmd, "--rank", o->lora_rank, "Train LoRA adapters of this rank (alpha = rank) on a frozen UNet")
                   ->check(in_range(1, 4096))
                   ->group(lora);
  add_lora_format_flag(cmd, o->lora_format, rank, lora);

  add_trainer_flags(cmd, o->training);
  add_python_only_training_flags(cmd);
  accepted_python_flag(cmd, "--set_grads_to_none", false, "gradients are already cleared without zero-filling");
  accepted_python_flag(cmd, "--skip_save_text_encoder", false,
                       "the pipeline is saved whole, with its text encoder, so that it loads as it is");
  accepted_python_flag(cmd, "--use_8bit_adam", false,
                       "bitsandbytes' 8-bit AdamW is CUDA-only; sdtrain trains with float32 AdamW state");

  cmd->callback([=, &chosen] {
    const bool lora_run = rank->count() != 0;
    if (o->train_text_encoder && pre_compute->count() != 0)
      throw CLI::ValidationError("--train_text_encoder", "cannot be used with --pre_compute_text_embeddings");
    const data::DreamBoothDataOptions& db = o->data.dreambooth;
    if (db.with_prior_preservation && (db.class_data_dir.empty() || db.class_prompt.empty()))
      throw CLI::ValidationError("--with_prior_preservation", "needs --class_data_dir and --class_prompt");
    if (!db.with_prior_preservation && (!db.class_data_dir.empty() || !db.class_prompt.empty()))
      log::warn(
          "--class_data_dir and --class_prompt are not used without --with_prior_preservation (as in the script)");
    if (lora_run) {
      // Only the text encoder's adapters train.
      o->train_text_encoder_lora = o->train_text_encoder;
      o->train_text_encoder = false;
      // The LoRA script's defaults where they differ; run.json records what was used.
      use_default(cmd->get_option("--output_dir"), o->training.output_dir, "lora-dreambooth-model");
      use_default(cmd->get_option("--learning_rate"), o->training.learning_rate, 5e-4);
    }
    // The full script validates every --validation_steps steps, the LoRA script every --validation_epochs epochs
    // and once more at the end.
    if (validation_epochs->count() != 0 || (lora_run && validation_steps->count() == 0)) {
      o->validation_steps.reset();
      use_default(validation_epochs, o->validation_epochs, 50);
    }
    if (*offset_noise) o->noise_offset = 0.1;
    if (!validation_prompt->empty()) o->validation_prompts = {*validation_prompt};
    record_command_line(cmd, o->training);
    o->data.output_dir = o->training.output_dir;
    chosen = [o, lora_run] { return lora_run ? train::run_lora_training(*o) : train::run_unet_training(*o); };
  });
}

}  // namespace sd::cli
