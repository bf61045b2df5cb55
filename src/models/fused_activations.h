// SiLU and GEGLU over float32 or bf16 activations, computed in float32 with the roundings of PyTorch's kernels
// (PyTorch 2's for bf16: each op's result rounded once), forward and backward one vectorized pass each.
//
// LibTorch 1.13's bf16 SiLU converts between bf16 and float32 around every step of x / (1 + e^-x), rounding each,
// and runs several times slower than its float32 kernel. Forward + backward (bench_fused_elementwise, 2 threads,
// AVX-512 bf16 host): 28.9 -> 10.5 µs on tiny-sd1's 2 x 32 x 8 x 8, 0.91 -> 0.17 ms on SD-1.5's 320 x 32 x 32.
//
// GEGLU (diffusers' a · GELU(g) over the two halves of a projection) is, in LibTorch, a chunk, a contiguous copy of
// the gate (1.13's bf16 GELU takes a scalar path on strided input), GELU, a product, and backward two products, GELU's
// backward and a concatenation: here one pass reads the projection and writes the output, and backward writes the
// projection's gradient directly.
//
// In float32 LibTorch's kernels are vectorized too, but these make fewer passes (`--dtype float32`, 2 threads,
// AVX-512 host without AMX): SiLU 1.1-1.8x, GEGLU 1.8-2.0x faster at tiny-sd1's and SD-1.5's shapes. exp and erf are
// sdtrain's own (core/simd.h, a few ulps), so float32 results differ from LibTorch's in the last bits.
#pragma once
#include <ATen/ATen.h>

namespace sd::models {

// Whether these kernels take x: a float32 or bf16 CPU tensor, on a CPU with AVX2 and FMA.
bool fused_activation_fits(const at::Tensor& x);

// x · σ(x), differentiable in x; x must fit (fused_activation_fits).
at::Tensor fused_silu(const at::Tensor& x);

// h [..., 2n] -> h[..., :n] · GELU(h[..., n:]) [..., n], GELU the exact (erf) one; differentiable in h, which must
// fit and have an even last dimension.
at::Tensor fused_geglu(const at::Tensor& h);

}  // namespace sd::models
