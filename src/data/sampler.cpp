#include "data/sampler.h"

#include <ATen/ATen.h>

#include "core/error.h"
#include "data/random_streams.h"

namespace sd::data {

DistributedSampler::DistributedSampler(int64_t dataset_size, BatchLayout layout, uint64_t seed)
    : size_(dataset_size), layout_(layout), seed_(seed) {
  SD_CHECK(size_ >= layout_.global(),
           "the dataset has {} samples, fewer than one global batch ({} per rank x {} accumulation x {} ranks); "
           "raise --repeats or lower the batch size",
           size_, layout_.batch, layout_.accumulation, layout_.world);
}

int64_t DistributedSampler::steps_per_epoch() const { return size_ / layout_.global(); }

std::vector<int64_t> DistributedSampler::epoch_order(int64_t epoch) const {
  at::Generator gen = stream_generator(seed_, Stream::kDataOrder, static_cast<uint64_t>(epoch));
  at::Tensor perm = at::randperm(size_, gen, at::TensorOptions().dtype(at::kLong));
  return std::vector<int64_t>(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + size_);
}

std::vector<int64_t> DistributedSampler::micro_batch(int64_t step, int64_t micro, int64_t rank) const {
  const int64_t epoch = step / steps_per_epoch();
  const int64_t step_in_epoch = step % steps_per_epoch();
  if (epoch != cached_epoch_) {
    cached_order_ = epoch_order(epoch);
    cached_epoch_ = epoch;
  }
  const std::vector<int64_t>& order = cached_order_;
  const int64_t start = step_in_epoch * layout_.global() + (micro * layout_.world + rank) * layout_.batch;
  return std::vector<int64_t>(order.begin() + start, order.begin() + start + layout_.batch);
}

BatchPlanner::BatchPlanner(int64_t dataset_size, BatchLayout layout, int rank, const uint64_t& seed)
    : dataset_size_(dataset_size), layout_(layout), rank_(rank), seed_(seed) {}

BatchRequest BatchPlanner::plan(int64_t step, int64_t micro) const {
  BatchRequest request{step, micro, (micro * layout_.world + rank_) * layout_.batch, {}};
  if (dataset_size_ == 0) return request;
  if (!sampler_ || sampler_seed_ != seed_) {
    sampler_ = std::make_unique<DistributedSampler>(dataset_size_, layout_, seed_);
    sampler_seed_ = seed_;
  }
  request.indices = sampler_->micro_batch(step, micro, rank_);
  return request;
}

BatchRequest BatchPlanner::after(const BatchRequest& request) const {
  return request.micro + 1 < layout_.accumulation ? plan(request.step, request.micro + 1) : plan(request.step + 1, 0);
}

}  // namespace sd::data
