#include "data/sampler.h"

#include <ATen/ATen.h>

#include <map>
#include <numeric>

#include "core/error.h"
#include "data/random_streams.h"

namespace sd::data {

namespace {

std::vector<int64_t> permutation(int64_t n, Stream stream, uint64_t seed, int64_t epoch) {
  at::Generator gen = stream_generator(seed, stream, static_cast<uint64_t>(epoch));
  const at::Tensor perm = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong));
  return std::vector<int64_t>(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + n);
}

// Samples in whole micro-batches of `batch` when every micro-batch is filled from one bucket.
int64_t bucketed_epoch_size(const std::vector<int32_t>& bucket_of, int64_t batch) {
  std::map<int32_t, int64_t> count;
  for (int32_t b : bucket_of) ++count[b];
  int64_t total = 0;
  for (const auto& [bucket, n] : count) total += n / batch * batch;
  return total;
}

int64_t epoch_size(int64_t dataset_size, const std::vector<int32_t>& bucket_of, int64_t batch) {
  return bucket_of.empty() ? dataset_size : bucketed_epoch_size(bucket_of, batch);
}

}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, BatchLayout layout, uint64_t seed,
                                       std::vector<int32_t> bucket_of)
    : size_(dataset_size),
      layout_(layout),
      seed_(seed),
      bucket_of_(std::move(bucket_of)),
      epoch_size_(epoch_size(size_, bucket_of_, layout_.batch)) {
  SD_CHECK(bucket_of_.empty() || static_cast<int64_t>(bucket_of_.size()) == size_,
           "{} bucket assignments for a dataset of {} samples", bucket_of_.size(), size_);
  // Fewer samples than a global batch still train: the batch is filled from the epoch's start (as an epoch's last
  // batch is). A bucket's micro-batch must be whole, though, so some bucket must hold one.
  SD_CHECK(epoch_size_ >= 1,
           "no bucket holds a whole micro-batch of {} samples of the {}: lower --train_batch_size, or widen the "
           "buckets (--bucket_reso_steps, --min_bucket_reso, --max_bucket_reso)",
           layout_.batch, size_);
}

int64_t steps_per_epoch(int64_t samples, const BatchLayout& layout) {
  return (samples + layout.global() - 1) / layout.global();
}

std::vector<int64_t> DistributedSampler::epoch_order(int64_t epoch) const {
  std::vector<int64_t> order = permutation(size_, Stream::kDataOrder, seed_, epoch);
  return bucket_of_.empty() ? order : group_by_bucket(order, epoch);
}

std::vector<int64_t> DistributedSampler::group_by_bucket(const std::vector<int64_t>& order, int64_t epoch) const {
  std::map<int32_t, std::vector<int64_t>> by_bucket;
  for (int64_t i : order) by_bucket[bucket_of_[static_cast<size_t>(i)]].push_back(i);
  std::vector<const int64_t*> micro_batches;  // the first sample of each
  for (const auto& [bucket, samples] : by_bucket)
    for (size_t start = 0; start + layout_.batch <= samples.size(); start += layout_.batch)
      micro_batches.push_back(samples.data() + start);
  std::vector<int64_t> grouped;
  grouped.reserve(static_cast<size_t>(epoch_size_));
  const auto count = static_cast<int64_t>(micro_batches.size());
  for (int64_t m : permutation(count, Stream::kBucketBatchOrder, seed_, epoch))
    grouped.insert(grouped.end(), micro_batches[m], micro_batches[m] + layout_.batch);
  return grouped;
}

std::vector<int64_t> DistributedSampler::micro_batch(int64_t step, int64_t micro, int64_t rank) const {
  const int64_t epoch = step / steps_per_epoch();
  const int64_t step_in_epoch = step % steps_per_epoch();
  if (epoch != cached_epoch_) {
    cached_order_ = epoch_order(epoch);
    cached_epoch_ = epoch;
  }
  const int64_t start = step_in_epoch * layout_.global() + (micro * layout_.world + rank) * layout_.batch;
  std::vector<int64_t> indices;
  // Past the epoch's end (its last step only): from its start again. With buckets epoch_size_ is a multiple of
  // batch, so a micro-batch still comes whole from one bucket.
  for (int64_t p = start; p < start + layout_.batch; ++p) indices.push_back(cached_order_[p % epoch_size_]);
  return indices;
}

BatchPlanner::BatchPlanner(int64_t dataset_size, BatchLayout layout, int rank, const uint64_t& seed,
                           std::vector<int32_t> bucket_of)
    : dataset_size_(dataset_size), layout_(layout), rank_(rank), seed_(seed), bucket_of_(std::move(bucket_of)) {}

BatchPlanner::BatchPlanner(PriorPairs pairs, BatchLayout layout, int rank, const uint64_t& seed)
    : BatchPlanner(pairs.count(), layout, rank, seed) {
  pairs_ = pairs;
}

int64_t BatchPlanner::samples_per_epoch() const { return epoch_size(dataset_size_, bucket_of_, layout_.batch); }

BatchRequest BatchPlanner::plan(int64_t step, int64_t micro) const {
  BatchRequest request{step, micro, (micro * layout_.world + rank_) * layout_.batch, {}};
  if (dataset_size_ == 0) return request;
  if (!sampler_ || sampler_seed_ != seed_) {
    sampler_ = std::make_unique<DistributedSampler>(dataset_size_, layout_, seed_, bucket_of_);
    sampler_seed_ = seed_;
  }
  request.indices = sampler_->micro_batch(step, micro, rank_);
  if (pairs_) {
    std::vector<int64_t> images;
    for (int64_t k : request.indices) images.push_back(k % pairs_->instances);
    for (int64_t k : request.indices) images.push_back(pairs_->instances + k % pairs_->classes);
    request.indices = std::move(images);
    request.first_position *= 2;
  }
  if (!bucket_of_.empty()) request.bucket = bucket_of_[static_cast<size_t>(request.indices.front())];
  return request;
}

BatchRequest BatchPlanner::after(const BatchRequest& request) const {
  return request.micro + 1 < layout_.accumulation ? plan(request.step, request.micro + 1) : plan(request.step + 1, 0);
}

std::vector<int64_t> random_subset(int64_t size, int64_t count, uint64_t seed) {
  std::vector<int64_t> all(static_cast<size_t>(size));
  std::iota(all.begin(), all.end(), 0);
  if (count >= size) return all;
  // A stream key past every epoch's, so the subset is not the first epoch's order.
  const std::vector<int64_t> order = permutation(size, Stream::kDataOrder, seed, -1);
  return std::vector<int64_t>(order.begin(), order.begin() + count);
}

}  // namespace sd::data
