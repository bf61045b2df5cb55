// How the models run a linear layer: y = x·Wᵀ + b, differentiable in all three, as at::linear. bf16 on a CPU takes
// oneDNN primitives kept per shape (core/onednn_matmul.h), forward and backward, with the same products as
// at::linear's; every other dtype or device takes at::linear itself.
#pragma once
#include <ATen/ATen.h>

namespace sd::models {

// x [..., in], weight [out, in], bias [out] or undefined -> [..., out].
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace sd::models
