// `sdtrain preprocess`: encodes image-caption data (an image folder or WebDataset shards) once with a pipeline's
// frozen VAE and text encoder into latent shards that `sdtrain train --train_latents` reads, under any launcher
// (each rank encodes its share), resumable after a kill.
#include "cli/commands.h"
#include "cli/data_flags.h"
#include "cli/flags.h"
#include "cli/model_flags.h"
#include "train/preprocess.h"

namespace sd::cli {

void add_preprocess(CLI::App& app, std::function<int()>& chosen) {
  auto* cmd = app.add_subcommand(
      "preprocess", "Encode images and captions into latent shards for `sdtrain train --train_latents` (docs/data.md)");
  auto o = std::make_shared<train::PreprocessOptions>();

  add_model_flags(cmd, "--pretrained_model_name_or_path", o->model)->required();
  flag(cmd, "--output_dir", o->output_dir,
       "Where the shards and index.json go; rerunning into it keeps finished shards and encodes the rest")
      ->required();

  const std::string inputs = "Inputs (one of --train_data_dir, --train_shards)";
  add_image_caption_flags(cmd, o->inputs, inputs);
  add_bucket_flags(cmd, o->inputs, inputs);

  const std::string outputs = "What is stored";
  cmd->add_option(flag_names("--resolution"), o->resolution,
                  "Image size(s) to encode at, e.g. --resolution 256 512 (center crops; with --enable_bucket the "
                  "buckets of each)")
      ->capture_default_str()
      ->expected(1, CLI::detail::expected_max_vector_size)
      ->group(outputs);
  flag(cmd, "--latents", o->latents,
       "moments: the VAE posterior's mean and std, from which training draws as online training does; sample: one "
       "posterior sample x the VAE's scaling factor (MosaicML's and Ray's latents)")
      ->check(CLI::IsMember({"moments", "sample"}))
      ->group(outputs);
  switch_flag(cmd, "--text_pooled", o->text_pooled, "Also store CLIP's pooled text embedding")->group(outputs);
  flag(cmd, "--samples_per_shard", o->samples_per_shard, "Samples per shard file (the unit of resuming)")
      ->check(in_range(1, 1000000))
      ->group(outputs);
  flag(cmd, "--seed", o->seed, "Seed of the posterior samples of --latents sample")
      ->check(seed_value())
      ->group(outputs);

  const std::string run = "Speed";
  flag(cmd, "--batch_size", o->batch_size, "Images per VAE forward pass")->check(in_range(1, 4096))->group(run);
  flag(cmd, "--threads", o->threads, "Intra-op threads of this rank (default: cores / ranks on this node)")
      ->check(in_range(1, 1024))
      ->group(run);

  cmd->callback([o, &chosen] { chosen = [o] { return train::run_preprocess(*o); }; });
}

}  // namespace sd::cli
