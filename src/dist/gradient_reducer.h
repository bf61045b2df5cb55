// Data-parallel gradient reduction over flat buckets (dist/bucket_layout.h). Each parameter's gradient is copied into
// its bucket's float32 buffer as soon as autograd has produced it (and the parameter's own .grad is dropped), and a
// bucket is sent as soon as all its gradients are in, so communication overlaps the rest of backward:
//   - without sharding, micro-batches accumulate locally and the last one's buckets are all-reduced (PyTorch DDP
//     with no_sync, then a sync step);
//   - with sharding, every micro-batch's buckets are reduce-scattered and each rank keeps only the sum of its own
//     slice, so no rank ever holds a whole model's gradients (FSDP's SHARD_GRAD_OP).
// Gradients are accumulated and reduced in float32 whatever the compute dtype. A single rank's single micro-batch sums
// nothing, so it copies nothing either: autograd's gradients are kept as they are, in the parameters' dtype (a copy
// into the buckets cost 0.3 s of a 3.7-4.5 s SD-1.5 step). finish() returns sums over ranks and micro-batches; dividing
// by them is the caller's choice.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/flat_pieces.h"
#include "dist/bucket_layout.h"
#include "dist/communicator.h"

namespace sd::dist {

class GradientReducer {
 public:
  // `params`: the trainable leaves (requires_grad), in the layout's order, identical in shape on every rank.
  GradientReducer(std::shared_ptr<Communicator> comm, std::vector<at::Tensor> params, const BucketLayout& layout);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Brackets each micro-batch's backward. `first`/`last`: the first/last micro-batch of the optimizer step.
  void begin_micro_batch(bool first, bool last);
  // Sends the buckets backward left incomplete (a parameter without a gradient counts as zeros).
  void end_micro_batch();
  // After the last micro-batch: waits for every bucket and returns per bucket this rank's owned slice of the gradient
  // summed over ranks and micro-batches (layout.owned_numel(b, rank) elements): one float32 piece, or for a lone
  // rank's only micro-batch one piece per parameter as autograd made it. The reducer keeps no reference to them:
  // they are freed when the caller drops them. Throws sd::Error naming a lost rank if a collective failed.
  std::vector<FlatPieces> finish();

  // How many buckets were sent while backward was still running, in the last step (for tests and metrics).
  int64_t buckets_sent_during_backward() const { return sent_during_backward_; }
  // The most bytes of gradient buffers alive at once so far: sharded, one micro-batch's buckets being filled, waiting
  // for an earlier bucket or travelling (the owned sums not counted); unsharded or kept, the step's whole gradient.
  int64_t peak_buffered_bytes() const { return peak_buffered_bytes_; }

 private:
  struct InFlight {
    size_t bucket;
    at::Tensor buffer;
    std::unique_ptr<PendingCollective> pending;
  };
  void on_grad_ready(size_t param);
  void keep_gradient_locked(size_t param);
  std::vector<FlatPieces> kept_gradients_locked();
  at::Tensor& buffer_for(size_t bucket);
  void send_ready_buckets_locked(bool flush);
  void send_bucket_locked(size_t bucket);
  void complete_oldest_locked();
  void check_hook_error_locked();

  std::shared_ptr<Communicator> comm_;
  std::vector<at::Tensor> params_;
  const BucketLayout& layout_;
  int rank_;
  bool sharded_;
  // Without sharding: the whole step's gradient per bucket. With sharding: per bucket the micro-batch being
  // gathered and the running sum of the owned slice. All undefined between steps (see buffer_for).
  std::vector<at::Tensor> buffers_;
  bool keep_autograd_grads_ = false;  // this micro-batch is a lone rank's only one: no buckets
  std::vector<at::Tensor> kept_;      // then per parameter: its gradient, flat
  std::vector<at::Tensor> owned_sums_;
  std::deque<InFlight> in_flight_;
  std::vector<bool> written_;  // parameter's gradient copied in during this micro-batch (or step, unsharded)
  std::vector<size_t> ready_;  // per bucket: parameters whose gradient is in
  size_t next_to_send_ = 0;
  bool first_ = true, last_ = true, in_backward_ = false;
  int64_t sent_during_backward_ = 0;
  int64_t buffered_bytes_ = 0, peak_buffered_bytes_ = 0;
  std::string hook_error_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<void>> accumulators_;  // keeps each AccumulateGrad node (and our hook) alive
  std::vector<uintptr_t> hook_keys_;
};

}  // namespace sd::dist
