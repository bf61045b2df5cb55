// AdamW with decoupled weight decay, the arithmetic of torch.optim.AdamW's single-tensor path (PyTorch 1.13) fused
// into one pass per tensor, over explicit (parameter, gradient) pairs of contiguous float32 tensors so it can update
// flat buffers or a rank's shard of them. Its moments are plain tensors, so checkpoints store and restore them
// exactly.
#pragma once
#include <ATen/ATen.h>

#include <vector>

#include "core/flat_pieces.h"

namespace sd::train {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  // Throws sd::Error naming the flag, for the values torch.optim.AdamW refuses.
  void validate() const;
};

// What AdamW's pass writes besides the parameters and moments, each optional (empty: not written).
struct AdamWFollowers {
  // bf16, per parameter: the new parameter rounded as .copy_() rounds, so a bf16 model's weights are refreshed
  // without reading the float32 masters again.
  std::vector<at::Tensor> rounded_copies;
  // float32, per parameter: diffusers' EMAModel.step, shadow -= (shadow - new parameter) * ema_one_minus_decay, in
  // torch's two roundings. A pass of its own would read every parameter again (4 of its 12 bytes per parameter).
  std::vector<at::Tensor> ema_shadows;
  float ema_one_minus_decay = 0;
};

class AdamW {
 public:
  explicit AdamW(AdamWOptions options);

  // One update of every params[i] by grad_scale * grads[i] (same numel; float32, or bf16 read exactly) at learning
  // rate `lr`. The moments are created (zeros, shaped like the parameters) on the first step. The scale lets a
  // caller fold averaging and clipping into this one pass instead of rewriting the gradients first; `followers`
  // are further writes of the same pass, from each new parameter while it is still in a register.
  void step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads, double lr,
            double grad_scale = 1.0, const AdamWFollowers& followers = {});
  // The same with each gradient in pieces that together cover its parameter's elements.
  void step(const std::vector<at::Tensor>& params, const std::vector<FlatPieces>& grads, double lr,
            double grad_scale = 1.0, const AdamWFollowers& followers = {});

  // Optimizer steps taken (torch's per-parameter `step`; here every parameter is updated at every step).
  int64_t steps() const { return steps_; }
  std::vector<at::Tensor>& exp_avg() { return exp_avg_; }
  std::vector<at::Tensor>& exp_avg_sq() { return exp_avg_sq_; }
  // Restores the moments (shaped like the parameters) and the step count, e.g. from a checkpoint.
  void set_state(std::vector<at::Tensor> exp_avg, std::vector<at::Tensor> exp_avg_sq, int64_t steps);

 private:
  AdamWOptions options_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  int64_t steps_ = 0;
};

}  // namespace sd::train
