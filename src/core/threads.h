// The compute thread setup of a process: LibTorch's intra-op (OpenMP) pool sized as asked, and OpenBLAS kept to the
// calling thread.
#pragma once

namespace sd {

// Sizes LibTorch's intra-op pool to `threads` and makes OpenBLAS single-threaded. Debian's OpenBLAS (pthread build)
// keeps a pool of its own; its threads and LibTorch's spinning OpenMP threads then fight for the same cores
// (perf: >40% of cycles in libgomp spin and sched_yield). Measured with bench_textual_inversion, 2 threads:
// SD-1.5 at 256² 6.82 -> 4.94 s/step in float32 and 2.66 -> 2.03 s/step in bf16; tiny 0.15 -> 0.07 s/step.
void set_compute_threads(int threads);

// The library that runs LibTorch's float32 GEMMs in this process (core/onednn_sgemm.cpp): "oneDNN".
const char* float32_gemm_library();

}  // namespace sd
