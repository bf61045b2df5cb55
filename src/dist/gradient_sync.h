// Data-parallel gradient averaging: parameters' .grad are averaged across ranks in buckets, each bucket's
// allreduce starting as soon as backward has produced all of its gradients (autograd hooks), so communication
// overlaps the rest of backward. Equal to allreduce_mean over all grads.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace sd::dist {

struct GradientSyncOptions {
  // Bucket size cap (PyTorch DDP's default is 25 MB). A parameter larger than the cap gets a bucket of its own.
  int64_t bucket_cap_bytes = 25LL << 20;
};

class GradientSync {
 public:
  // `params`: the trainable parameters (requires_grad leaves), identical in order, shape and dtype on all ranks.
  GradientSync(std::shared_ptr<Communicator> comm, std::vector<at::Tensor> params, GradientSyncOptions opts = {});
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // Call before the backward that completes this optimizer step (with gradient accumulation: before the last
  // micro-batch's backward; earlier backwards accumulate locally). During that backward each bucket is sent as
  // soon as its gradients are final.
  void prepare_for_backward();

  // Sends what was not sent yet, waits for all buckets, and writes the mean over ranks into every parameter's
  // .grad (a parameter without a gradient on this rank counts as zeros there). Correct with or without
  // prepare_for_backward(); throws sd::Error naming the lost rank if a collective fails.
  void finish();

  size_t num_buckets() const { return buckets_.size(); }
  // Parameter indices per bucket, in launch order (reverse parameter order, as backward tends to produce them).
  std::vector<std::vector<size_t>> bucket_layout() const;
  // How many buckets of the last finish() were already sent during backward (for tests and metrics).
  int64_t buckets_sent_during_backward() const { return sent_during_backward_; }

 private:
  struct Bucket {
    std::vector<size_t> params;
    std::vector<int64_t> offsets;
    at::Tensor flat;
    size_t ready = 0;
    bool sent = false;
    std::unique_ptr<PendingCollective> pending;
  };
  void on_grad_ready(size_t param_index);
  void send_ready_buckets_locked();
  void send_bucket_locked(Bucket& bucket);

  std::shared_ptr<Communicator> comm_;
  std::vector<at::Tensor> params_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<bool> grad_ready_;
  size_t next_to_send_ = 0;
  bool armed_ = false;
  int64_t sent_during_backward_ = 0;
  std::string hook_error_;
  std::mutex mutex_;
  // Keeps each parameter's AccumulateGrad node (and thus our hook) alive across iterations.
  std::vector<std::shared_ptr<void>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
};

}  // namespace sd::dist
