// SiLU and GEGLU over bf16 activations, computed in float32 with the roundings of PyTorch 2's bf16 kernels (each op's
// result rounded once), forward and backward one vectorized pass each.
//
// LibTorch 1.13's bf16 SiLU converts between bf16 and float32 around every step of x / (1 + e^-x), rounding each,
// and runs several times slower than its float32 kernel. Forward + backward (bench_bf16_elementwise, 2 threads,
// AVX-512 bf16 host): 28.9 -> 10.5 µs on tiny-sd1's 2 x 32 x 8 x 8, 0.91 -> 0.17 ms on SD-1.5's 320 x 32 x 32.
//
// GEGLU (diffusers' a · GELU(g) over the two halves of a projection) is, in LibTorch, a chunk, a contiguous copy of
// the gate (1.13's bf16 GELU takes a scalar path on strided input), GELU, a product, and backward two products, GELU's
// backward and a concatenation: here one pass reads the projection and writes the output, and backward writes the
// projection's gradient directly.
#pragma once
#include <ATen/ATen.h>

namespace sd::models {

// Whether these kernels take x: a bf16 CPU tensor, on a CPU with AVX2 and FMA.
bool bf16_activation_fits(const at::Tensor& x);

// x · σ(x), differentiable in x; x must fit (bf16_activation_fits).
at::Tensor bf16_silu(const at::Tensor& x);

// h [..., 2n] -> h[..., :n] · GELU(h[..., n:]) [..., n], GELU the exact (erf) one; differentiable in h, which must
// fit and have an even last dimension.
at::Tensor bf16_geglu(const at::Tensor& h);

}  // namespace sd::models
