// Where `sdtrain train` gets its micro-batches. A source hands out, for a micro-batch of the trainer's layout,
// either images and captions (for the frozen VAE and text encoder to encode) or latents and text embeddings that are
// already encoded. Sources:
//   ImageCaptionSource  a folder on disk (data/image_caption_dataset.h), decoded and augmented on loader threads;
//   SyntheticSource     random images and captions, or random latents and embeddings (MosaicML's synthetic data,
//                       to measure the UNet alone);
//   ReplaySource        recorded inputs, noise and timesteps of a reference run (--replay_inputs).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/image_caption_dataset.h"
#include "data/image_transforms.h"
#include "data/prefetcher.h"
#include "data/sampler.h"
#include "io/safetensors.h"
#include "text/clip_tokenizer.h"

namespace sd::data {

struct TrainingBatch {
  at::Tensor pixel_values;           // [B, 3, H, W] float32 in [-1, 1]; or
  at::Tensor input_ids;              // [B, 77] int64
  at::Tensor latents;                // [B, C, h, w] float32, already times the VAE's scaling factor; and
  at::Tensor encoder_hidden_states;  // [B, 77, D]
  at::Tensor noise, timesteps;       // replay only: the reference's draws
  bool encoded() const { return latents.defined(); }
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Samples the trainer's sampler draws from (0 for sources that have no dataset to count epochs with).
  virtual int64_t size() const = 0;
  virtual TrainingBatch get(const BatchRequest& request) = 0;
  // Seconds get() spent waiting for a loader since the last call (then reset).
  virtual double take_wait_seconds() { return 0; }
};

struct ImageCaptionSourceOptions {
  ImageTransformOptions transform;
  int loader_threads = 1;
  int prefetch_micro_batches = 4;
};

class ImageCaptionSource : public BatchSource {
 public:
  // `seed` is read at each request (a resumed run changes it); `planner` tells which micro-batches come next, so the
  // loader works ahead.
  ImageCaptionSource(ImageCaptionDataset dataset, const text::ClipTokenizer& tokenizer,
                     ImageCaptionSourceOptions options, const uint64_t& seed, const BatchPlanner& planner);
  int64_t size() const override { return dataset_.size(); }
  TrainingBatch get(const BatchRequest& request) override;
  double take_wait_seconds() override;

 private:
  TrainingBatch load(const BatchRequest& request) const;

  ImageCaptionDataset dataset_;
  const text::ClipTokenizer& tokenizer_;
  ImageCaptionSourceOptions options_;
  const uint64_t& seed_;
  const BatchPlanner& planner_;
  Prefetcher<TrainingBatch> prefetcher_;
  std::deque<BatchRequest> requested_;  // what the prefetcher is preparing, in order
  double waited_s_ = 0;
};

struct SyntheticOptions {
  std::string kind = "images";  // "images" (pixels + captions) or "latents" (latents + text embeddings)
  int64_t samples = 100000;
  int resolution = 512;
  int64_t latent_channels = 4;
  int64_t vae_scale_factor = 8;
  int64_t embedding_dim = 768;  // text encoder width, for "latents"
};

// Sample i of the synthetic dataset is a function of (seed, i): an epoch sees the same samples again.
class SyntheticSource : public BatchSource {
 public:
  SyntheticSource(SyntheticOptions options, const text::ClipTokenizer* tokenizer, const uint64_t& seed);
  int64_t size() const override { return options_.samples; }
  TrainingBatch get(const BatchRequest& request) override;

 private:
  SyntheticOptions options_;
  const text::ClipTokenizer* tokenizer_;
  const uint64_t& seed_;
};

// --replay_inputs: stepK.latents, stepK.noise, stepK.timesteps and stepK.encoder_hidden_states of a global batch per
// step; rank r of `world` takes the contiguous r-th slice of every global batch, micro-batch m the m-th part of it.
class ReplaySource : public BatchSource {
 public:
  ReplaySource(const std::filesystem::path& file, BatchLayout layout, int rank);
  int64_t size() const override { return 0; }
  TrainingBatch get(const BatchRequest& request) override;
  int64_t steps() const { return steps_; }

 private:
  io::TensorMap tensors_;
  std::filesystem::path file_;
  BatchLayout layout_;
  int rank_;
  int64_t steps_ = 0;
};

}  // namespace sd::data
