// What this CPU can do that changes how sdtrain should compute.
#pragma once

namespace sd {

// Whether LibTorch 1.13 runs bf16 matmuls and convolutions through oneDNN here: it does when the CPU has AVX-512
// BW, VL and DQ (the test of its mkldnn_bf16_device_check). Elsewhere (AVX2-only CPUs) it falls back to plain loops
// that run ~15x slower than float32 and sum the products in bf16 (measured here: 4 GFLOP/s against 50-70).
bool cpu_runs_bf16_natively();

}  // namespace sd
