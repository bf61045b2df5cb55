// Where `sdtrain train` gets its micro-batches. A source hands out, for a micro-batch of the trainer's layout,
// images and captions (for the frozen VAE and text encoder to encode), stored VAE posteriors and text embeddings,
// or latents and text embeddings ready for the UNet. Sources:
//   ImageCaptionSource  an image folder or WebDataset shards (data/image_caption_dataset.h), decoded and augmented
//                       on loader threads;
//   LatentSource        precomputed latents (data/latent_shards.h), read on loader threads;
//   SyntheticSource     random images and captions, or random latents and embeddings (MosaicML's synthetic data,
//                       to measure the UNet alone);
//   ReplaySource        recorded inputs, noise and timesteps of a reference run (--replay_inputs).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/captions.h"
#include "data/image_caption_dataset.h"
#include "data/image_transforms.h"
#include "data/latent_shards.h"
#include "data/prefetcher.h"
#include "data/sampler.h"
#include "io/safetensors.h"
#include "text/clip_tokenizer.h"

namespace sd::data {

struct TrainingBatch {
  at::Tensor pixel_values;             // [B, 3, H, W] float32 in [-1, 1], with
  at::Tensor input_ids;                // [B, 77] int64: to encode; or
  at::Tensor latent_mean, latent_std;  // [B, C, h, w] a VAE posterior (unscaled), to draw latents from; or
  at::Tensor latents;                  // [B, C, h, w] float32, already times the VAE's scaling factor;
  at::Tensor encoder_hidden_states;    // [B, 77, D] with either form of latents
  at::Tensor noise, timesteps;         // replay only: the reference's draws
  at::Tensor loss_weights;             // [B] float32 when some sample weighs other than 1 (--prior_loss_weight)
};

// latents = (mean + std * eps) * scaling_factor, eps drawn per sample from its kPosterior stream: the same draw
// whether the posterior was just computed from pixels or stored by `sdtrain preprocess`, so both train alike.
at::Tensor sample_posterior(const at::Tensor& mean, const at::Tensor& std, double scaling_factor, uint64_t seed,
                            const BatchRequest& request);

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual TrainingBatch get(const BatchRequest& request) = 0;
  // Seconds get() spent waiting for a loader since the last call (then reset).
  virtual double take_wait_seconds() { return 0; }
};

// Prepares the micro-batches the trainer will ask for next (in the planner's order) on loader threads, so a step
// does not wait for reading and decoding. A source owns one as its last member, so its loaders stop before the
// rest of the source goes.
class LookaheadLoader {
 public:
  using Load = std::function<TrainingBatch(const BatchRequest&)>;
  LookaheadLoader(const BatchPlanner& planner, Load load, int threads, int micro_batches_ahead);
  TrainingBatch get(const BatchRequest& request);
  double take_wait_seconds();

 private:
  void request(const BatchRequest& request);

  const BatchPlanner& planner_;
  Load load_;
  int ahead_;
  std::deque<BatchRequest> requested_;  // what the prefetcher is preparing, in order
  double waited_s_ = 0;
  Prefetcher<TrainingBatch> prefetcher_;
};

struct LoaderOptions {
  int threads = 1;
  int micro_batches_ahead = 4;
};

struct ImageCaptionSourceOptions {
  ImageTransformOptions transform;
  CaptionOptions captions;
  std::vector<Resolution> buckets;  // with aspect-ratio buckets: what BatchRequest::bucket numbers
  LoaderOptions loader;
};

class ImageCaptionSource : public BatchSource {
 public:
  // `seed` is read at each request (a resumed run changes it); `planner` tells which micro-batches come next.
  ImageCaptionSource(std::unique_ptr<ImageCaptionDataset> dataset, const text::ClipTokenizer& tokenizer,
                     ImageCaptionSourceOptions options, const uint64_t& seed, const BatchPlanner& planner);
  TrainingBatch get(const BatchRequest& request) override { return loader_.get(request); }
  double take_wait_seconds() override { return loader_.take_wait_seconds(); }

 private:
  TrainingBatch load(const BatchRequest& request) const;

  std::unique_ptr<ImageCaptionDataset> dataset_;
  const text::ClipTokenizer& tokenizer_;
  ImageCaptionSourceOptions options_;
  const uint64_t& seed_;
  LookaheadLoader loader_;
};

class LatentSource : public BatchSource {
 public:
  LatentSource(std::unique_ptr<LatentDataset> dataset, CaptionOptions captions, LoaderOptions loader,
               const uint64_t& seed, const BatchPlanner& planner);
  TrainingBatch get(const BatchRequest& request) override { return loader_.get(request); }
  double take_wait_seconds() override { return loader_.take_wait_seconds(); }

 private:
  TrainingBatch load(const BatchRequest& request) const;

  std::unique_ptr<LatentDataset> dataset_;
  CaptionOptions captions_;
  const uint64_t& seed_;
  LookaheadLoader loader_;
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
