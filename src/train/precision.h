// The one place that decides dtypes for training and generation from --mixed_precision. Trained weights are held
// in float32 ("master" weights, with the AdamW moments, the EMA and the gradients, except that one rank's single
// micro-batch keeps autograd's bf16 gradients, as nothing is summed); the forward and backward run in
// the compute dtype (bf16 under mixed precision) on a copy the optimizer step refreshes; frozen models (the VAE, the
// text encoder, a textual-inversion UNet) are stored in the compute dtype. Norms and softmax accumulate in float32
// inside the models (models/diffusers_blocks.h), and losses are taken in float32.
#pragma once
#include <c10/core/ScalarType.h>

#include <string>

namespace sd::train {

struct PrecisionPolicy {
  at::ScalarType compute = at::kFloat;  // forward/backward of the trained model
  at::ScalarType frozen = at::kFloat;   // models that are not trained
  at::ScalarType master = at::kFloat;   // trained weights, gradients, optimizer state, EMA

  // "no" -> float32 everywhere; "bf16" -> bf16 compute and frozen models; "fp16" is taken as bf16 (CPUs have no
  // fast float16 kernels). On a CPU where bf16 arithmetic is slower than float32 (no AVX-512, AVX-512 without
  // bf16 instructions, or bf16 dot products at half of float32's rate and no AMX: core/cpu_features.h) bf16 is
  // computed in float32, unless SDTRAIN_FORCE_BF16=1 asks for bf16 on the AVX-512 ones (to exercise the bf16 path
  // there). Each substitution is announced on the main rank.
  static PrecisionPolicy from_flag(const std::string& mixed_precision);
  bool mixed() const { return compute != master; }
};

}  // namespace sd::train
