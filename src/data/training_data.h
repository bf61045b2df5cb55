// The data of a `sdtrain train` run from its flags: which source (an image folder, WebDataset shards, precomputed
// latents, synthetic data or a replay), the planner that picks each micro-batch's samples (with aspect-ratio
// buckets when asked), and the source that loads them.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "data/captions.h"
#include "data/dreambooth_images.h"
#include "data/image_transforms.h"
#include "data/training_batches.h"
#include "text/clip_tokenizer.h"

namespace sd::data {

// The data flags; field names are the flags'.
struct TrainingDataOptions {
  std::string train_data_dir;
  std::string reg_data_dir;        // kohya's regularization images, beside --train_data_dir
  double prior_loss_weight = 1.0;  // their loss weight (or DreamBooth's class images')
  std::string output_dir;      // the run's own, left out of a --train_data_dir that holds it (its images are outputs)
  std::string train_shards;    // a shard pattern (data/shard_pattern.h)
  std::string train_latents;   // a `sdtrain preprocess` output
  std::string synthetic_data;  // "images" or "latents"
  std::string replay_inputs;
  DreamBoothDataOptions dreambooth;  // `sdtrain dreambooth`'s instance and class images
  std::string image_column = "image";
  std::string caption_column = "text";
  std::optional<int64_t> max_train_samples;
  ImageTransformOptions transform;
  bool enable_bucket = false;
  int min_bucket_reso = 256;
  int max_bucket_reso = 1024;
  int bucket_reso_steps = 64;
  CaptionOptions captions;
  int dataloader_num_workers = 0;
  int64_t synthetic_samples = 100000;
};

enum class DataKind { kImageFolder, kShards, kLatents, kSyntheticImages, kSyntheticLatents, kReplay, kDreamBooth };

// Which source the flags choose; throws sd::Error unless exactly one is given.
DataKind data_kind(const TrainingDataOptions& options);
// Whether the source hands out pixels and captions, which the VAE and text encoder must encode.
bool needs_encoders(DataKind kind);
// Loader threads: --dataloader_num_workers, at least one.
int loader_threads(const TrainingDataOptions& options);

// An image folder or WebDataset shards, from --train_data_dir or --train_shards (shards are indexed on `threads`
// threads).
std::unique_ptr<ImageCaptionDataset> open_image_captions(const TrainingDataOptions& options, int threads);

// The bucket sizes of kohya's rules for the flags' --resolution and --*_bucket_reso.
std::vector<Resolution> bucket_resolutions(const TrainingDataOptions& options);

// What the model asks of the data: stored latents and synthetic data must fit it.
struct ModelShapes {
  int64_t latent_channels = 4;
  int64_t vae_scale_factor = 8;
  double vae_scaling_factor = 0.18215;
  int64_t text_dim = 768;
};

struct TrainingData {
  std::unique_ptr<BatchPlanner> planner;
  std::unique_ptr<BatchSource> source;
  std::optional<int64_t> replay_steps;  // with --replay_inputs: the steps its file holds
  // A digest of the listed files (ImageCaptionDataset::fingerprint, LatentDataset::fingerprint) ranks compare at
  // start-up, since each node may hold its own copy of the data; empty for synthetic and replayed data.
  std::string listing_fingerprint;
  // kohya's count of the listing (ImageCaptionDataset::sample_counts; DreamBooth's instance and class images); for
  // latents and synthetic data, their samples.
  SampleCounts sample_counts;
};

// Opens the data the flags name for rank `rank` of `layout`. `seed` is read at each request (a resumed run changes
// it). Throws sd::Error (one line naming the flag and file) for data that is missing, malformed or does not fit
// the model.
TrainingData open_training_data(const TrainingDataOptions& options, const text::ClipTokenizer& tokenizer,
                                const ModelShapes& model, const uint64_t& seed, const BatchLayout& layout, int rank);

}  // namespace sd::data
