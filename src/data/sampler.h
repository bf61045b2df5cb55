// Data order for data-parallel training. Each epoch is a permutation of the dataset drawn from (seed, epoch); an
// optimizer step consumes the next `global_batch` indices of it, split into micro-batches of `batch` per rank:
// micro-batch m of rank r takes positions (m * world + r) * batch ... + batch. The same samples make up an optimizer
// step whatever the world size, so 1 rank with accumulation and N ranks without train on the same data.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace sd::data {

struct BatchLayout {
  int64_t batch = 1;         // per rank, per micro-batch
  int64_t accumulation = 1;  // micro-batches per optimizer step
  int64_t world = 1;
  int64_t global() const { return batch * accumulation * world; }
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, BatchLayout layout, uint64_t seed);

  // Optimizer steps in one epoch: the incomplete last global batch is dropped, so every step has the same size.
  int64_t steps_per_epoch() const;
  // Dataset indices of micro-batch `micro` of rank `rank` at optimizer step `step` (counted from the run's start).
  std::vector<int64_t> micro_batch(int64_t step, int64_t micro, int64_t rank) const;
  // The permutation of one epoch.
  std::vector<int64_t> epoch_order(int64_t epoch) const;

 private:
  int64_t size_;
  BatchLayout layout_;
  uint64_t seed_;
  // The permutation of the epoch micro_batch() last served: every micro-batch of an epoch reads the same one.
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_order_;
};

// Which samples make up a micro-batch of a rank: the positions of its samples in the step's global batch (the key of
// their random draws) and, for a dataset, the indices the sampler picks. Reads the seed at each call, so a resumed
// run's seed takes effect.
struct BatchRequest {
  int64_t step = 0, micro = 0;
  int64_t first_position = 0;    // samples are positions first_position .. first_position + batch - 1
  std::vector<int64_t> indices;  // empty without a dataset
};

class BatchPlanner {
 public:
  // `dataset_size` 0: no dataset (positions only).
  BatchPlanner(int64_t dataset_size, BatchLayout layout, int rank, const uint64_t& seed);
  BatchRequest plan(int64_t step, int64_t micro) const;
  // The micro-batch the trainer asks for after `request`.
  BatchRequest after(const BatchRequest& request) const;
  const BatchLayout& layout() const { return layout_; }

 private:
  int64_t dataset_size_;
  BatchLayout layout_;
  int rank_;
  const uint64_t& seed_;
  mutable std::unique_ptr<DistributedSampler> sampler_;
  mutable uint64_t sampler_seed_ = 0;
};

}  // namespace sd::data
