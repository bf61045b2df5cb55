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

// Whether the CPU has bf16 dot-product instructions (AVX512_BF16, which every AMX-BF16 CPU has too: Cooper Lake and
// later Xeons, Zen 4 and Zen 5) on top of AVX-512 BW, VL and DQ. AVX-512 CPUs without them (Skylake-SP, Cascade
// Lake, Ice Lake Xeons) run oneDNN's emulated bf16 kernels, measured at ~55-60 GFLOP/s against 230-350 for float32
// on the same two cores (docs/benchmarks.md).
bool cpu_has_bf16_instructions();

// How many flops a core's bf16 dot products (vdpbf16ps) do for each flop of its float32 multiply-adds (512-bit FMAs),
// measured once (~2 ms) and kept; 0 without bf16 instructions. Sapphire and Emerald Rapids read ~0.5 (one vdpbf16ps
// every two cycles against two FMAs a cycle), and there oneDNN's bf16 matmuls run at 55-60% of its float32 ones
// unless AMX tiles take them; on Zen 4 oneDNN's bf16 runs at about twice its float32 (docs/benchmarks.md,
// forty-seventh sitting).
double cpu_bf16_dot_product_rate();
// The measurement itself, made again on every call (for tests of its stability).
double measure_bf16_dot_product_rate();

// Whether bf16 matmuls and convolutions outrun float32 ones here, so that `--mixed_precision bf16` should compute in
// bf16: the CPU has bf16 instructions and either AMX-BF16 tiles (oneDNN multiplies bf16 in them) or dot products
// doing at least kFastBf16DotProductRate of float32's flops. The line sits well between the kinds measured (~0.5 and
// ~2); a CPU at equal flops keeps bf16, which also halves the products' memory traffic.
constexpr double kFastBf16DotProductRate = 0.75;
bool cpu_has_fast_bf16();

// Whether the CPU has AVX2 and FMA, which sdtrain's own vector kernels (core/simd.h) need at least.
bool cpu_has_avx2_fma();

// The widest vectors sdtrain's own kernels (core/simd.h) use: 512 bits on a CPU with AVX-512F (twice the floats per
// instruction), else 256 (AVX2). Setting 256 runs the AVX2 kernels on any CPU, so that tests check both widths; 512
// needs AVX-512F.
int kernel_vector_bits();
void set_kernel_vector_bits(int bits);

}  // namespace sd
