// SiLU over bf16 activations, computed in float32 and rounded once, forward and backward one vectorized pass each.
// LibTorch 1.13's bf16 SiLU converts between bf16 and float32 around every step of x / (1 + e^-x), rounding each,
// and runs several times slower than its float32 kernel. Forward + backward (bench_bf16_elementwise, 2 threads,
// AVX-512 bf16 host): 28.9 -> 10.5 µs on tiny-sd1's 2 x 32 x 8 x 8, 0.91 -> 0.17 ms on SD-1.5's 320 x 32 x 32.
// Rounding once is what PyTorch 2's bf16 kernels and GPU autocast do.
#pragma once
#include <ATen/ATen.h>

namespace sd::models {

// Whether bf16_silu takes x: a bf16 CPU tensor, on a CPU with AVX2 and FMA.
bool bf16_silu_fits(const at::Tensor& x);

// x · σ(x), differentiable in x; x must fit (bf16_silu_fits).
at::Tensor bf16_silu(const at::Tensor& x);

}  // namespace sd::models
