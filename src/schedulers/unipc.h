// UniPCMultistepScheduler (diffusers 0.24): the unified predictor-corrector of Zhao et al. (2023,
// arXiv:2302.04867). Each step first corrects the previous step's result with the model output just computed
// (UniC), then predicts the next sample from the history of outputs (UniP). diffusers' defaults: data prediction
// (predict_x0), B(h) = e^h - 1 (bh2), order 2, lower orders for the first and last steps.
#pragma once
#include "schedulers/multistep_scheduler.h"

namespace sd::schedulers {

class UniPCMultistepScheduler : public MultistepScheduler {
 public:
  explicit UniPCMultistepScheduler(SchedulerConfig config);
  std::string class_name() const override { return "UniPCMultistepScheduler"; }
  void set_timesteps(int num_inference_steps) override;
  at::Tensor step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                  Noise noise = {}) override;

 private:
  // What the predictor and the corrector share for a move from sigma[from] to sigma[to] that uses the last
  // `order` model outputs.
  struct Update {
    at::Tensor first_order;       // the move with the newest output alone (a DDIM / DPM-Solver-1 step)
    at::Tensor scale;             // multiplies the higher-order terms: alpha_to * B(h) (sigma_to * B(h) for noise)
    std::vector<at::Tensor> D1s;  // (m_k - m_0) / r_k for the older outputs, r_k = their lambda offset / h
    at::Tensor R, b;              // the order conditions R rho = b on the weights rho
  };
  Update prepare_update(int64_t from, int64_t to, const at::Tensor& x, int order) const;
  // UniP: sample at the next sigma from `sample` at this one (multistep_uni_p_bh_update).
  at::Tensor predict(const at::Tensor& sample, int order) const;
  // UniC: this step's sample recomputed from the last one with this step's own model output as well
  // (multistep_uni_c_bh_update).
  at::Tensor correct(const at::Tensor& this_output, int order) const;

  bool bh1_ = false;        // B(h) = h (else e^h - 1)
  at::Tensor last_sample_;  // the sample the last prediction started from
  int this_order_ = 0;      // the order of the last prediction, which its correction reuses
};

}  // namespace sd::schedulers
