// AdamW with decoupled weight decay, the same arithmetic as torch.optim.AdamW's single-tensor path (PyTorch 1.13),
// with its state as plain tensors so checkpoints can store and restore it exactly.
#pragma once
#include <ATen/ATen.h>

#include <vector>

#include "io/safetensors.h"

namespace sd::train {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

class AdamW {
 public:
  AdamW(std::vector<at::Tensor> params, AdamWOptions options);

  // One update of every parameter that has a gradient, at learning rate `lr`.
  void step(double lr);
  void zero_grad();

  // State as named tensors ("<i>.exp_avg", "<i>.exp_avg_sq", "<i>.step") for checkpoints; load checks shapes.
  io::TensorMap state() const;
  void load_state(const io::TensorMap& state, const std::string& source);

 private:
  struct ParamState {
    at::Tensor exp_avg, exp_avg_sq;
    int64_t step = 0;
  };
  std::vector<at::Tensor> params_;
  std::vector<ParamState> state_;
  AdamWOptions options_;
};

}  // namespace sd::train
