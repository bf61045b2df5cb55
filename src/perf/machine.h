// What a benchmark measures about the machine: the CPU, peak resident memory, network traffic and the GEMM throughput
// MFU is taken against.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace sd::perf {

// The processor as the kernel names it ("model name" in /proc/cpuinfo), or "unknown CPU".
std::string cpu_model_name();
// What decides sdtrain's arithmetic on this CPU (core/cpu_features.h): "AVX-512 with bf16 instructions", "AVX-512
// with slow bf16 instructions" (half-rate dot products, no AMX: bf16 computed in float32), "AVX-512 without bf16
// instructions" or "no AVX-512". Numbers from different kinds do not compare.
const char* cpu_kind();

// Resets this process's peak-RSS mark (Linux >= 4.0), so peak_rss_bytes() covers only what follows.
void reset_peak_rss();
// The kernel's high-water mark of this process's resident memory (VmHWM), or -1 if unknown.
int64_t peak_rss_bytes();
// This process's anonymous memory backed by transparent huge pages (AnonHugePages), or -1 if unknown.
int64_t huge_page_bytes();

// Bytes this machine's network interfaces (all but loopback, in this process's network namespace) have sent and
// received since they came up, from /proc/net/dev: the difference over a stretch of training is its traffic.
struct NetworkBytes {
  int64_t sent = 0, received = 0;
};
NetworkBytes network_bytes();

// GFLOP/s of LibTorch's at::mm on n x n matrices of `dtype` with the current intra-op threads: the fastest of
// `repeats` after a warm-up. What the machine's matmul kernels reach, the denominator of MFU: a peak, so the best
// reading, not a typical one (on a shared host a median of 5 taken just after a run could read 434 where the run's
// own products had gone at ~500 GFLOP/s, an MFU of 111%).
double gemm_gflops(at::ScalarType dtype, int64_t n = 1024, int repeats = 20);

}  // namespace sd::perf
