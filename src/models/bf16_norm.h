// Group norm and layer norm over bf16 activations, computed in float32 and rounded once to bf16, each one autograd
// node forward and one backward. What they replace (models/diffusers_blocks.h: the input and the weights cast to
// float32, LibTorch's float32 norm, the result cast back) is ~35 ops and four autograd nodes per norm, and two float32
// copies of the activation each way; tiny-sd1's textual-inversion step runs 90 norms. Forward + backward
// (bench_bf16_elementwise, 2 threads, AVX-512 bf16 host): 35 -> 15 µs for tiny-sd1's group norms, 0.22 -> 0.10 ms
// for SD-1.5's over 320 x 32 x 32, 0.26 -> 0.14 ms for its layer norm over 1024 tokens.
//
// The numbers are those of that path up to float32 summation order: the mean and the biased variance (summed as
// squared deviations from the mean) in float32, y = (x − mean) · rstd · gamma + beta rounded to bf16; backward keeps
// float32 until it writes dx (rounded once) and the parameters' gradients (in the parameters' dtype). Each row's
// values are summed by one thread in a fixed order, so results do not depend on the thread count.
#pragma once
#include <ATen/ATen.h>

namespace sd::models {

// Whether these norms take these inputs: a non-empty bf16 CPU input, defined weight and bias in float32 or bf16, and a
// CPU with AVX2 and FMA.
bool bf16_norm_fits(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// at::group_norm's result: x [N, C, *] in `groups` groups of C / groups channels, weight and bias [C].
at::Tensor bf16_group_norm(const at::Tensor& x, int64_t groups, const at::Tensor& weight, const at::Tensor& bias,
                           double eps);

// at::layer_norm's result over x's last normalized_shape.size() dimensions; weight and bias of normalized_shape.
at::Tensor bf16_layer_norm(const at::Tensor& x, at::IntArrayRef normalized_shape, const at::Tensor& weight,
                           const at::Tensor& bias, double eps);

}  // namespace sd::models
