// `sdtrain preprocess`: encodes image-caption data once with a pipeline's frozen VAE and text encoder into latent
// shards (data/latent_shards.h), so that `sdtrain train --train_latents` runs the UNet alone (the offline stage of
// the Ray and MosaicML recipes).
//
// Input sample i goes to shard i / samples_per_shard whatever the number of ranks; rank r encodes the shards
// k = r, r + world, ... Each shard is written under a temporary name and renamed into place, so after a kill a
// shard either exists whole or not at all; a rerun keeps the shards that exist (after checking they were made
// with the same settings) and encodes the rest. The ranks never wait for each other: whichever finds every shard
// present after writing its own writes index.json, last, and with it the directory counts as complete.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "data/image_caption_dataset.h"
#include "data/latent_shards.h"
#include "data/training_data.h"
#include "io/safetensors.h"
#include "models/clip/clip_text_model.h"
#include "models/vae/autoencoder_kl.h"
#include "pipeline/model_source.h"
#include "text/clip_tokenizer.h"

namespace sd::train {

// Field names are the flags'.
struct PreprocessOptions {
  pipeline::ModelRequest model;      // --pretrained_model_name_or_path, --revision, --variant, --config_from
  data::TrainingDataOptions inputs;  // --train_data_dir or --train_shards, the columns, buckets, loader threads
  std::vector<int> resolution = {512};
  std::string latents = "moments";  // or "sample": one posterior sample x the VAE's scaling factor
  bool text_pooled = false;         // also store CLIP's pooled output
  std::string output_dir;
  int64_t samples_per_shard = 256;
  int batch_size = 8;  // images per VAE forward
  uint64_t seed = 0;   // of the posterior samples of --latents sample
  std::optional<int> threads;
};

// The frozen encoders and what they make of samples.
class LatentEncoder {
 public:
  // Loads the pipeline's tokenizer, text encoder and VAE in float32.
  explicit LatentEncoder(const PreprocessOptions& options);

  // Samples [first, end) of `dataset`, as a latent shard holds them (see data/latent_shards.h).
  io::TensorMap encode(const data::ImageCaptionDataset& dataset, int64_t first, int64_t end);
  // The tensors of empty_caption.safetensors.
  io::TensorMap encode_empty_caption();
  // index.json's description of the encoders' output (the shards are added by the caller).
  data::LatentsIndex describe() const;
  // A digest of the VAE's and text encoder's weights (names, shapes and each tensor's first and last values): shards
  // made by another model must not be kept as this one's.
  std::string weights_fingerprint() const;

 private:
  struct Prepared;
  LatentEncoder(const PreprocessOptions& options, pipeline::StableDiffusion encoders);
  Prepared prepare(const data::ImageCaptionDataset& dataset, int64_t index) const;
  // The latents of `samples` at resolution number `r` from their pixels, into `out`.
  void encode_images(const std::vector<int64_t>& samples, const std::vector<at::Tensor>& pixels, size_t r,
                     io::TensorMap& out);
  // The text embeddings of samples first, first + 1, ... from their captions, into `out`.
  void encode_captions(const std::vector<std::vector<std::string>>& captions, int64_t first, io::TensorMap& out);

  PreprocessOptions options_;
  text::ClipTokenizer tokenizer_;
  models::ClipTextModel text_encoder_{nullptr};
  models::AutoencoderKL vae_{nullptr};
  std::vector<std::vector<data::Resolution>> buckets_;  // per resolution, with --enable_bucket
};

// Runs the whole preprocessing on this rank; returns the process exit code.
int run_preprocess(const PreprocessOptions& options);

}  // namespace sd::train
