// Group norm and layer norm over float32 or bf16 activations, computed in float32 (bf16 results rounded once), each
// one autograd node forward and one backward.
//
// bf16: what they replace (models/diffusers_blocks.h: the input and the weights cast to float32, LibTorch's float32
// norm, the result cast back) is ~35 ops and four autograd nodes per norm, and two float32 copies of the activation
// each way; tiny-sd1's textual-inversion step runs 90 norms. Forward + backward (bench_fused_elementwise, 2 threads,
// AVX-512 bf16 host): 35 -> 15 µs for tiny-sd1's group norms, 0.22 -> 0.10 ms for SD-1.5's over 320 x 32 x 32, 0.26
// -> 0.14 ms for its layer norm over 1024 tokens.
// float32: LibTorch's own norm is one node, but its backward makes several passes and ops (`--dtype float32`, 2
// threads, AVX-512 host without AMX): 1.3-1.55x faster at tiny-sd1's and SD-1.5's shapes for group norm, 1.1-1.4x
// for layer norm.
//
// The numbers are LibTorch's float32 ones up to float32 summation order: the mean and the biased variance (summed as
// squared deviations from the mean) in float32, y = (x − mean) · rstd · gamma + beta (rounded to bf16 for bf16 x);
// backward keeps float32 until it writes dx (in x's dtype) and the parameters' gradients (in the parameters' dtype).
// Each row's values are summed by one thread in a fixed order, so results do not depend on the thread count.
#pragma once
#include <ATen/ATen.h>

namespace sd::models {

// Whether these norms take these inputs: a non-empty float32 or bf16 CPU input, defined weight and bias in float32 or
// bf16, and a CPU with AVX2 and FMA.
bool fused_norm_fits(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// at::group_norm's result: x [N, C, *] in `groups` groups of C / groups channels, weight and bias [C].
at::Tensor fused_group_norm(const at::Tensor& x, int64_t groups, const at::Tensor& weight, const at::Tensor& bias,
                            double eps);

// at::layer_norm's result over x's last normalized_shape.size() dimensions; weight and bias of normalized_shape.
at::Tensor fused_layer_norm(const at::Tensor& x, at::IntArrayRef normalized_shape, const at::Tensor& weight,
                            const at::Tensor& bias, double eps);

}  // namespace sd::models
