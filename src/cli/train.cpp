// `sdtrain train`: full UNet training with the flags of diffusers' examples/text_to_image/train_text_to_image.py,
// same names and defaults, or with --lora_rank LoRA training as train_text_to_image_lora.py does it, plus the data and
// initialisation options of the MosaicML and Ray/Anyscale recipes (WebDataset shards, precomputed latents, synthetic
// data, UNet from scratch, a global batch), kohya's buckets and caption options, and a reference-run replay.
#include "cli/commands.h"
#include "cli/data_flags.h"
#include "cli/flags.h"
#include "cli/model_flags.h"
#include "cli/training_flags.h"
#include "train/tasks/lora_training.h"

namespace sd::cli {

void add_train(CLI::App& app, std::function<int()>& chosen) {
  auto* cmd = app.add_subcommand("train", "Train the UNet of a Stable Diffusion pipeline (fine-tune or from scratch)");
  // The UNet options plus LoRA's; --lora_rank chooses which training runs.
  auto o = std::make_shared<train::LoraTrainingOptions>();

  const std::string model = "Model";
  add_model_flags(cmd, "--pretrained_model_name_or_path", o->model, model)->required();
  switch_flag(cmd, "--from_scratch", o->from_scratch,
              "Start the UNet from its config's initialisation (seeded by --seed) instead of its weights")
      ->group(model);
  flag(cmd, "--prediction_type", o->prediction_type, "epsilon or v_prediction (default: the scheduler config's)")
      ->check(CLI::IsMember({"epsilon", "v_prediction"}))
      ->group(model);
  add_unet_memory_flags(cmd, o->unet_memory, model);

  data::TrainingDataOptions& d = o->data;
  const std::string data =
      "Data (one of --train_data_dir, --train_shards, --train_latents, --synthetic_data, --replay_inputs)";
  add_image_caption_flags(cmd, d, data);
  flag(cmd, "--reg_data_dir", d.reg_data_dir,
       "Regularization images (DreamBooth's prior preservation) in kohya's layout, e.g. 1_dog/*.png: balanced to as "
       "many samples per epoch as --train_data_dir's, as kohya does; their loss weighs --prior_loss_weight")
      ->group(data);
  flag(cmd, "--prior_loss_weight", d.prior_loss_weight, "Loss weight of the --reg_data_dir images (kohya's default 1)")
      ->check(non_negative_number())
      ->group(data);
  flag(cmd, "--train_latents", d.train_latents,
       "Latents and text embeddings written by `sdtrain preprocess`: trains with no VAE or text encoder in memory")
      ->group(data);
  flag(cmd, "--max_train_samples", d.max_train_samples, "Train on a seeded random subset of this many samples")
      ->check(at_least(1))
      ->group(data);
  flag(cmd, "--synthetic_data", d.synthetic_data,
       "images: random images and captions; latents: random latents and text embeddings (no VAE or text encoder)")
      ->check(CLI::IsMember({"images", "latents"}))
      ->group(data);
  flag(cmd, "--synthetic_samples", d.synthetic_samples, "Samples in one synthetic epoch")
      ->check(in_range(1, 100000000))
      ->group(data);
  flag(cmd, "--replay_inputs", d.replay_inputs,
       "Replay a reference run's steps from a safetensors file (stepK.latents, .noise, .timesteps, "
       ".encoder_hidden_states); writes replay.safetensors with each step's loss, lr and grad norm")
      ->group(data);
  flag(cmd, "--resolution", d.transform.resolution, "Training image size")->check(in_range(8, 16384))->group(data);
  switch_flag(cmd, "--center_crop", d.transform.center_crop, "Center-crop after resizing (default: random crop)")
      ->group(data);
  switch_flag(cmd, "--random_flip", d.transform.random_flip, "Flip images horizontally at random")->group(data);

  const std::string buckets = "Aspect-ratio buckets and captions";
  add_bucket_flags(cmd, d, buckets);
  flag(cmd, "--caption_dropout_probability", d.captions.dropout_probability,
       "Train this share of sample uses with an empty caption, for classifier-free guidance (MosaicML: 0.1)")
      ->group(buckets);
  switch_flag(cmd, "--shuffle_caption", d.captions.shuffle, "Shuffle the comma-separated tags of each caption (kohya)")
      ->group(buckets);
  flag(cmd, "--keep_tokens", d.captions.keep_tokens, "With --shuffle_caption: keep the first N tags in place")
      ->group(buckets);

  const std::string loss = "Loss";
  flag(cmd, "--snr_gamma", o->snr_gamma, "Min-SNR loss weighting gamma (arXiv 2303.09556; 5.0 is recommended)")
      ->group(loss);
  flag(cmd, "--noise_offset", o->noise_offset, "Scale of per-channel offset noise")
      ->check(finite_number())
      ->group(loss);
  flag(cmd, "--input_perturbation", o->input_perturbation, "Scale of input perturbation (0.1 is recommended)")
      ->check(finite_number())
      ->group(loss);
  switch_flag(cmd, "--dream_training", o->dream_training,
              "DREAM (arXiv 2312.00210): move input and target by what a prediction without gradient misses of the "
              "noise; one more UNet forward per micro-batch, epsilon prediction only")
      ->group(loss);
  flag(cmd, "--dream_detail_preservation", o->dream_detail_preservation,
       "DREAM's p: the correction is scaled by sqrt(1 - alphas_cumprod[t])^p")
      ->check(positive_number())
      ->group(loss);

  const std::string validation = "Validation";
  auto* validation_prompts =
      cmd->add_option(flag_names("--validation_prompts"), o->validation_prompts,
                      "Prompts to generate images for every --validation_epochs epochs (into <output_dir>/validation)")
          ->expected(1, CLI::detail::expected_max_vector_size)
          ->check(not_a_flag())
          ->group(validation);
  // The LoRA script's form: one prompt, several images of it.
  auto validation_prompt = std::make_shared<std::string>();
  auto* one_prompt = flag(cmd, "--validation_prompt", *validation_prompt,
                          "One prompt to generate --num_validation_images images for (train_text_to_image_lora.py's "
                          "form of --validation_prompts)")
                         ->excludes(validation_prompts)
                         ->group(validation);
  auto* num_images = flag(cmd, "--num_validation_images", o->num_validation_images,
                          "Images per validation prompt (default: 4 with --validation_prompt, as the LoRA script)")
                         ->check(in_range(1, 64))
                         ->group(validation);
  auto* validation_epochs = flag(cmd, "--validation_epochs", o->validation_epochs,
                                 "Validate every N epochs (default: 1 with --lora_rank, as the LoRA script)")
                                ->check(at_least(1))
                                ->group(validation);

  const std::string lora = "LoRA (diffusers' train_text_to_image_lora.py; see docs/lora.md)";
  auto* lora_rank = cmd->add_option(flag_names("--lora_rank") + ",--rank", o->lora_rank,
                                    "Train LoRA adapters of this rank (the LoRA script's --rank, default 4) on a "
                                    "frozen UNet instead of the whole UNet")
                        ->check(in_range(1, 4096))
                        ->group(lora);
  flag(cmd, "--lora_alpha", o->lora_alpha, "Adapter outputs are scaled by alpha / rank (default: alpha = rank)")
      ->needs(lora_rank)
      ->group(lora);
  flag(cmd, "--lora_target_modules", o->lora_target_modules,
       "Comma-separated layer names to adapt, matched by the end of their module path as peft does (e.g. to_q, "
       "attn2.to_k, proj_in, conv1 for LoCon)")
      ->delimiter(',')
      ->needs(lora_rank)
      ->group(lora);
  switch_flag(cmd, "--train_text_encoder_lora", o->train_text_encoder_lora,
              "Also adapt the text encoder's q_proj, k_proj, v_proj and out_proj")
      ->needs(lora_rank)
      ->group(lora);
  add_lora_format_flag(cmd, o->lora_format, lora_rank, lora);

  add_trainer_flags(cmd, o->training);
  add_python_only_training_flags(cmd);
  accepted_python_flag(cmd, "--non_ema_revision", true, "the UNet trained is that of --revision; ignored");
  accepted_python_flag(cmd, "--cache_dir", true,
                       "sdtrain downloads nothing; Hub names are read from HF_HUB_CACHE (else HF_HOME/hub); ignored");
  accepted_python_flag(cmd, "--tracker_project_name", true, "metrics go to --logging_dir; ignored");
  accepted_python_flag(cmd, "--offload_ema", false,
                       "the EMA shadow already lives in host memory, updated within AdamW's pass; ignored");
  accepted_python_flag(cmd, "--foreach_ema", false, "the EMA update already runs over flat buffers; ignored");
  accepted_python_flag(cmd, "--use_8bit_adam", false,
                       "bitsandbytes' 8-bit AdamW is CUDA-only; sdtrain trains with float32 AdamW state");
  std::string hub_dataset;
  cmd->add_option(flag_names("--dataset_name"), hub_dataset,
                  "(not supported) Hub datasets need the network; give a local folder with --train_data_dir")
      ->group("Python-only (accepted, not used)")
      ->check([](const std::string& name) {
        return "sdtrain reads local data only: download the dataset, then give its folder with --train_data_dir "
               "(got '" +
               name + "')";
      });
  accepted_python_flag(cmd, "--dataset_config_name", true, "only with --dataset_name, which sdtrain does not take");

  cmd->get_option("--output_dir")
      ->description("Where the results, checkpoints and logs go (sd-model-finetuned-lora with --lora_rank)");
  cmd->callback([=, &chosen] {
    const bool lora = lora_rank->count() != 0;
    // Where the two scripts' defaults differ, --lora_rank takes the LoRA script's; run.json records what was used.
    CLI::Option* output_dir = cmd->get_option("--output_dir");
    if (lora && output_dir->count() == 0) {
      o->training.output_dir = "sd-model-finetuned-lora";
      output_dir->default_str(o->training.output_dir);
    }
    if (lora && validation_epochs->count() == 0) {
      o->validation_epochs = 1;
      validation_epochs->default_str("1");
    }
    if (lora) o->validation_inference_steps = 30;
    if (one_prompt->count() != 0) {
      o->validation_prompts = {*validation_prompt};
      if (num_images->count() == 0) {
        o->num_validation_images = 4;
        num_images->default_str("4");
      }
    }
    record_command_line(cmd, o->training);
    o->data.output_dir = o->training.output_dir;
    chosen = [o, lora] { return lora ? train::run_lora_training(*o) : train::run_unet_training(*o); };
  });
}

}  // namespace sd::cli
