// Counter-based random streams: a generator for (seed, purpose, step, sample) that does not depend on which rank
// or micro-batch draws it, so a run's result is independent of how many ranks share the global batch.
#pragma once
#include <ATen/core/Generator.h>

#include <cstdint>

namespace sd::data {

enum class Stream : uint64_t {
  kDataOrder = 1,
  kAugment = 2,
  kPrompt = 3,  // a template (textual inversion) or one of a sample's captions
  kPosterior = 4,
  kNoise = 5,
  kTimestep = 6,
  kNoiseOffset = 7,
  kPerturbation = 8,
  kSynthetic = 9,          // synthetic samples, keyed by their index
  kLoraInit = 10,          // a LoRA adapter's initial down weight, keyed by the adapted layer's index
  kBucketBatchOrder = 11,  // the order of an epoch's one-bucket micro-batches
  kCaptionDropout = 12,
  kCaptionShuffle = 13,
  kStoredPosterior = 14,  // `sdtrain preprocess --latents sample`, keyed by sample number and resolution
};

// A CPU generator seeded from a hash of all four numbers.
at::Generator stream_generator(uint64_t seed, Stream purpose, uint64_t a, uint64_t b = 0);

// The streams of one use of a sample: position `position` of the global batch of optimizer step `step`.
struct SampleStreams {
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t position = 0;
  at::Generator operator()(Stream purpose) const {
    return stream_generator(seed, purpose, static_cast<uint64_t>(step), static_cast<uint64_t>(position));
  }
};

}  // namespace sd::data
