// Data order for data-parallel training. Each epoch is a permutation of the dataset drawn from (seed, epoch); an
// optimizer step consumes the next `global_batch` indices of it, split into micro-batches of `batch` per rank:
// micro-batch m of rank r takes positions (m * world + r) * batch ... + batch. The same samples make up an optimizer
// step whatever the world size, so 1 rank with accumulation and N ranks without train on the same data. The
// epoch's last global batch, when the epoch runs out before it is full, is filled from the start of the epoch's
// order (as accelerate's even_batches fills it across processes), so every step has the same size.
// With aspect-ratio buckets every micro-batch must hold images of one size: the epoch's permutation is grouped by
// bucket into micro-batches (a bucket's last incomplete one is left out), and these are put in an order drawn from
// (seed, epoch) too. Every rank computes the same plan, so both properties survive bucketing.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace sd::data {

struct BatchLayout {
  int64_t batch = 1;         // per rank, per micro-batch
  int64_t accumulation = 1;  // micro-batches per optimizer step
  int64_t world = 1;
  int64_t global() const { return batch * accumulation * world; }
};

// Optimizer steps in an epoch of `samples`: the last, incomplete global batch counts, as diffusers' scripts count
// an epoch (a DataLoader without drop_last).
int64_t steps_per_epoch(int64_t samples, const BatchLayout& layout);

class DistributedSampler {
 public:
  // `bucket_of`: the bucket of every sample, with aspect-ratio buckets; empty without.
  DistributedSampler(int64_t dataset_size, BatchLayout layout, uint64_t seed, std::vector<int32_t> bucket_of = {});

  // Samples one epoch's order holds: the dataset, or with buckets the samples of whole micro-batches.
  int64_t samples_per_epoch() const { return epoch_size_; }
  int64_t steps_per_epoch() const { return data::steps_per_epoch(epoch_size_, layout_); }
  // Dataset indices of micro-batch `micro` of rank `rank` at optimizer step `step` (counted from the run's start).
  std::vector<int64_t> micro_batch(int64_t step, int64_t micro, int64_t rank) const;
  // The order of one epoch: a permutation of the dataset, or with buckets of its samples in whole micro-batches.
  std::vector<int64_t> epoch_order(int64_t epoch) const;

 private:
  // `order` regrouped into micro-batches of one bucket each, in an order drawn for `epoch`.
  std::vector<int64_t> group_by_bucket(const std::vector<int64_t>& order, int64_t epoch) const;

  int64_t size_;
  BatchLayout layout_;
  uint64_t seed_;
  std::vector<int32_t> bucket_of_;
  int64_t epoch_size_;
  // The permutation of the epoch micro_batch() last served: every micro-batch of an epoch reads the same one.
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_order_;
};

// Which samples make up a micro-batch of a rank: the positions of its samples in the step's global batch (the key of
// their random draws) and, for a dataset, the indices the sampler picks. Reads the seed at each call, so a resumed
// run's seed takes effect.
struct BatchRequest {
  int64_t step = 0, micro = 0;
  int64_t first_position = 0;    // sample j (one per index) is at position first_position + j
  std::vector<int64_t> indices;  // empty without a dataset
  int32_t bucket = -1;           // with aspect-ratio buckets, the one bucket of all its samples
};

// DreamBooth's prior preservation (diffusers' train_dreambooth.py): a dataset of `instances` instance images, then
// `classes` class images, trained in pairs. Pair k is instance image k % instances with class image k % classes; an
// epoch is max(instances, classes) pairs.
struct PriorPairs {
  int64_t instances = 0, classes = 0;
  int64_t count() const { return std::max(instances, classes); }
};

class BatchPlanner {
 public:
  // `dataset_size` 0: no dataset (positions only). `bucket_of` as DistributedSampler's.
  BatchPlanner(int64_t dataset_size, BatchLayout layout, int rank, const uint64_t& seed,
               std::vector<int32_t> bucket_of = {});
  // Plans pairs: the layout's batch counts pairs, and a micro-batch of B pairs holds their B instance images, then
  // their B class images (the script's collate order), at positions 2 * p ... 2 * p + 2B - 1 for the pairs' first
  // position p, so the samples of a step still each have positions (and random draws) of their own.
  BatchPlanner(PriorPairs pairs, BatchLayout layout, int rank, const uint64_t& seed);
  // Samples in one epoch (0 without a dataset): the trainer counts epochs with it.
  int64_t samples_per_epoch() const;
  BatchRequest plan(int64_t step, int64_t micro) const;
  // Images a planned sample holds: 2 for pairs.
  int64_t images_per_sample() const { return pairs_ ? 2 : 1; }
  // The micro-batch the trainer asks for after `request`.
  BatchRequest after(const BatchRequest& request) const;
  const BatchLayout& layout() const { return layout_; }

 private:
  int64_t dataset_size_;
  BatchLayout layout_;
  int rank_;
  const uint64_t& seed_;
  std::vector<int32_t> bucket_of_;
  std::optional<PriorPairs> pairs_;
  mutable std::unique_ptr<DistributedSampler> sampler_;
  mutable uint64_t sampler_seed_ = 0;
};

// --max_train_samples: the indices of `count` of `size` samples picked at random from the seed, the same on every
// rank (the reference script's dataset.shuffle(seed).select(range(count))); all of them, in order, when count >= size.
std::vector<int64_t> random_subset(int64_t size, int64_t count, uint64_t seed);

// Keeps `values[i]` for each i of `indices`, in that order: what a dataset's select() does to its samples.
template <typename T>
void keep_indices(std::vector<T>& values, const std::vector<int64_t>& indices) {
  std::vector<T> kept;
  kept.reserve(indices.size());
  for (int64_t i : indices) kept.push_back(values.at(static_cast<size_t>(i)));
  values = std::move(kept);
}

}  // namespace sd::data
