#include "dist/gradient_reducer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "core/error.h"

namespace sd::dist {
namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

// Runs after a parameter's AccumulateGrad node, i.e. once .grad holds this backward's gradient.
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit GradReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  variable_list operator()(const variable_list& outputs, const variable_list& inputs) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

GradientReducer::GradientReducer(std::shared_ptr<Communicator> comm, std::vector<at::Tensor> params,
                                 const BucketLayout& layout)
    : comm_(std::move(comm)),
      params_(std::move(params)),
      layout_(layout),
      rank_(comm_->rank()),
      sharded_(layout.sharded()) {
  SD_CHECK(params_.size() == layout_.num_params(), "GradientReducer: {} parameters but a layout of {}", params_.size(),
           layout_.num_params());
  SD_CHECK(layout_.world() == comm_->world_size(), "GradientReducer: a layout for {} ranks in a world of {}",
           layout_.world(), comm_->world_size());
  const size_t num_buckets = layout_.buckets().size();
  buffers_.resize(num_buckets);
  ready_.assign(num_buckets, 0);
  written_.assign(params_.size(), false);
  owned_sums_.resize(num_buckets);
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    SD_CHECK(p.defined() && p.requires_grad() && p.is_leaf(),
             "GradientReducer: parameter {} must be a leaf tensor that requires grad", i);
    SD_CHECK(p.numel() == layout_.slot_of(i).numel, "GradientReducer: parameter {} has {} elements, the layout {}", i,
             p.numel(), layout_.slot_of(i).numel);
    std::shared_ptr<Node> acc = torch::autograd::impl::grad_accumulator(p);
    SD_CHECK(acc, "GradientReducer: parameter {} has no gradient accumulator", i);
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<GradReadyHook>([this, i] { on_grad_ready(i); })));
    accumulators_.push_back(acc);
  }
}

GradientReducer::~GradientReducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i)
    std::static_pointer_cast<Node>(accumulators_[i])->del_post_hook(hook_keys_[i]);
}

void GradientReducer::begin_micro_batch(bool first, bool last) {
  std::lock_guard<std::mutex> lock(mutex_);
  first_ = first;
  last_ = last;
  in_backward_ = true;
  if (first) {
    sent_during_backward_ = 0;
    owned_sums_.assign(owned_sums_.size(), at::Tensor());  // only left over if a step was abandoned
  }
  // Unsharded, a step's micro-batches accumulate into the same buffers: the first write of a step copies.
  if (sharded_ || first) written_.assign(written_.size(), false);
  keep_autograd_grads_ = comm_->world_size() == 1 && first && last;
  kept_.assign(keep_autograd_grads_ ? params_.size() : 0, at::Tensor());
  ready_.assign(ready_.size(), 0);
  next_to_send_ = 0;
}

void GradientReducer::on_grad_ready(size_t i) {
  std::lock_guard<std::mutex> lock(mutex_);
  at::Tensor& p = params_[i];
  if (!hook_error_.empty() || !in_backward_) {
    p.mutable_grad() = at::Tensor();
    return;
  }
  try {
    if (keep_autograd_grads_) {
      keep_gradient_locked(i);
      return;
    }
    const size_t b = layout_.bucket_of(i);
    const BucketSlot& slot = layout_.slot_of(i);
    at::Tensor dst = buffer_for(b).narrow(0, slot.offset, slot.numel);
    const at::Tensor grad = p.grad().reshape({-1});
    if (written_[i])
      dst.add_(grad);
    else
      dst.copy_(grad);
    written_[i] = true;
    p.mutable_grad() = at::Tensor();  // the bucket holds it now
    ++ready_[b];
    send_ready_buckets_locked(/*flush=*/false);
  } catch (const std::exception& e) {
    hook_error_ = e.what();
  }
}

// AccumulateGrad hands over autograd's own tensor whenever it can, strided like the (contiguous) parameter.
void GradientReducer::keep_gradient_locked(size_t i) {
  at::Tensor& p = params_[i];
  kept_[i] = p.grad().contiguous().view({-1});
  p.mutable_grad() = at::Tensor();
  buffered_bytes_ += kept_[i].nbytes();
  peak_buffered_bytes_ = std::max(peak_buffered_bytes_, buffered_bytes_);
}

// Sharded, at most this many buckets travel while backward goes on; a bucket needing a buffer beyond that first
// waits for the oldest to arrive, so communication slower than backward cannot pile up gradients.
constexpr size_t kMaxBucketsInFlight = 2;

// Buffers are allocated when a bucket's first gradient of the step (sharded: of the micro-batch) arrives and released
// after the optimizer step (sharded: once reduced), so gradient memory grows while backward frees the activations
// instead of adding to them. Each has its bucket's own size: with sharding, gradients of later buckets can wait in
// theirs while an earlier bucket is still incomplete, and a pool sized by the largest bucket would waste most.
at::Tensor& GradientReducer::buffer_for(size_t b) {
  if (!buffers_[b].defined()) {
    while (sharded_ && in_flight_.size() >= kMaxBucketsInFlight) complete_oldest_locked();
    buffers_[b] = at::empty({layout_.buckets()[b].padded_numel}, at::kFloat);
    buffered_bytes_ += buffers_[b].nbytes();
    peak_buffered_bytes_ = std::max(peak_buffered_bytes_, buffered_bytes_);
  }
  return buffers_[b];
}

// Buckets go out strictly in index order, so every rank issues the same collectives in the same order even when
// its backward finished gradients in a different order.
void GradientReducer::send_ready_buckets_locked(bool flush) {
  if (!sharded_ && !last_) return;  // unsharded, only the step's last micro-batch communicates
  const auto& buckets = layout_.buckets();
  while (next_to_send_ < buckets.size() && (flush || ready_[next_to_send_] == buckets[next_to_send_].slots.size())) {
    send_bucket_locked(next_to_send_);
    if (in_backward_ && !flush) ++sent_during_backward_;
    ++next_to_send_;
  }
}

void GradientReducer::send_bucket_locked(size_t b) {
  const Bucket& bucket = layout_.buckets()[b];
  at::Tensor& buffer = buffer_for(b);
  for (const BucketSlot& slot : bucket.slots)
    if (!written_[slot.param]) buffer.narrow(0, slot.offset, slot.numel).zero_();
  if (bucket.padded_numel > bucket.numel) buffer.narrow(0, bucket.numel, bucket.padded_numel - bucket.numel).zero_();
  if (sharded_) {
    in_flight_.push_back({b, buffer, comm_->reduce_scatter_sum_async(buffer)});
    buffers_[b] = at::Tensor();  // the buffer travels; it is released once folded in
  } else {
    in_flight_.push_back({b, buffer, comm_->allreduce_sum_async(buffer)});
  }
}

void GradientReducer::complete_oldest_locked() {
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  f.pending->wait();
  if (!sharded_) return;
  const at::Tensor mine =
      f.buffer.narrow(0, layout_.owned_begin(f.bucket, rank_), layout_.owned_numel(f.bucket, rank_));
  // The step's first reduced micro-batch starts each sum.
  if (owned_sums_[f.bucket].defined())
    owned_sums_[f.bucket].add_(mine);
  else
    owned_sums_[f.bucket] = mine.clone();
  buffered_bytes_ -= f.buffer.nbytes();
}

void GradientReducer::check_hook_error_locked() {
  if (hook_error_.empty()) return;
  std::string error = std::move(hook_error_);
  hook_error_.clear();
  throw Error(error);
}

void GradientReducer::end_micro_batch() {
  std::lock_guard<std::mutex> lock(mutex_);
  in_backward_ = false;
  check_hook_error_locked();
  if (!keep_autograd_grads_) send_ready_buckets_locked(/*flush=*/true);
}

std::vector<FlatPieces> GradientReducer::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  check_hook_error_locked();
  if (keep_autograd_grads_) return kept_gradients_locked();
  while (!in_flight_.empty()) complete_oldest_locked();
  std::vector<at::Tensor> sums(buffers_.size());
  std::swap(sums, sharded_ ? owned_sums_ : buffers_);
  if (!sharded_) buffered_bytes_ = 0;
  std::vector<FlatPieces> reduced;
  for (at::Tensor& sum : sums) reduced.push_back({{0, std::move(sum)}});
  return reduced;
}

// A parameter that took no part in the step's loss gets zeros, as in a bucket.
std::vector<FlatPieces> GradientReducer::kept_gradients_locked() {
  std::vector<FlatPieces> reduced(layout_.buckets().size());
  for (size_t b = 0; b < reduced.size(); ++b)
    for (const BucketSlot& slot : layout_.buckets()[b].slots) {
      at::Tensor& kept = kept_[slot.param];
      if (!kept.defined()) kept = at::zeros({slot.numel}, params_[slot.param].options().requires_grad(false));
      reduced[b].push_back({slot.offset, std::move(kept)});
    }
  kept_.clear();
  buffered_bytes_ = 0;
  return reduced;
}

}  // namespace sd::dist
