// The squared L2 norm of one gradient, the term torch.nn.utils.clip_grad_norm_ takes per parameter.
#pragma once
#include <ATen/ATen.h>

#include <vector>

namespace sd::train {

// float32: LibTorch's own norm kernel (the reference's digits). bf16 (a lone rank's gradients, kept as autograd made
// them): one pass that widens each value exactly and sums the squares in float64; converting to float32 first for
// at::norm cost more than the norm itself (profiled: 0.25 s per SD-1.5 step). Float64 sums make it the exact norm of
// the values to ~1e-12, closer than LibTorch's float32 kernel (which strayed by 1e-5 of the norm at 300 K values).
double squared_l2_norm(const at::Tensor& gradient);

// The sum of squared_l2_norm over `pieces`, added in their order, with the threads each taking whole pieces: a
// float32 norm runs LibTorch's kernel on one thread (it reduces a tensor to one value serially), so two threads
// norming two pieces at once halve the pass (profiled: at::norm 0.25 of 3.7 s per SD-1.5 step) with the same digits.
double sum_of_squared_l2_norms(const std::vector<at::Tensor>& pieces);

}  // namespace sd::train
