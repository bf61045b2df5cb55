// What this CPU can do that changes how sdtrain should compute.
#pragma once

namespace sd {

// Whether LibTorch 1.13 runs bf16 matmuls and convolutions through oneDNN here, summing products in float32: it
// does when the CPU has AVX-512 BW, VL and DQ (the test of its mkldnn_bf16_device_check). Elsewhere (AVX2-only
// CPUs) it falls back to plain loops that sum the products in bf16 and run ~15x slower than float32.
bool cpu_runs_bf16_in_onednn();

// Whether oneDNN's float32 GEMM (sdtrain's sgemm, core/onednn_sgemm.cpp) runs its AVX-512 kernels here: the CPU has
// AVX-512 BW, VL and DQ (oneDNN's avx512_core), the same test as cpu_runs_bf16_in_onednn.
bool cpu_runs_avx512_sgemm();

// Whether bf16 arithmetic is fast here: the CPU has bf16 dot-product instructions (AVX512_BF16, which every
// AMX-BF16 CPU has too: Cooper Lake and Sapphire Rapids Xeons, Zen 4). AVX-512 CPUs without them (Skylake-SP,
// Cascade Lake, Ice Lake Xeons) run oneDNN's emulated bf16 kernels, measured at ~55-60 GFLOP/s against 230-350 for
// float32 on the same two cores (docs/benchmarks.md).
bool cpu_has_fast_bf16();

// Whether the CPU has AVX2 and FMA, which sdtrain's own vector kernels (core/simd.h) need at least.
bool cpu_has_avx2_fma();

// The widest vectors sdtrain's own kernels (core/simd.h) use: 512 bits on a CPU with AVX-512F (twice the floats per
// instruction), else 256 (AVX2). Setting 256 runs the AVX2 kernels on any CPU, so that tests check both widths; 512
// needs AVX-512F.
int kernel_vector_bits();
void set_kernel_vector_bits(int bits);

}  // namespace sd
