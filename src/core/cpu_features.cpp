#include "core/cpu_features.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>

#include "core/error.h"

namespace sd {

namespace {

bool cpu_has_avx512_core() {
  static const bool avx512 =
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return avx512;
}

}  // namespace

bool cpu_runs_bf16_in_onednn() { return cpu_has_avx512_core(); }

bool cpu_runs_avx512_sgemm() { return cpu_has_avx512_core(); }

bool cpu_has_bf16_instructions() {
  static const bool bf16 = cpu_runs_bf16_in_onednn() && __builtin_cpu_supports("avx512bf16");
  return bf16;
}

namespace {

// Twelve independent accumulators: more than any core's latency x throughput for these instructions, so the loop
// times the throughput, of bf16 dot products (vdpbf16ps) or of float32 multiply-adds (512-bit FMAs). It returns a
// value made of every accumulator, so that none of the work can be dropped.
constexpr int kChains = 12;

template <bool kBf16>
__attribute__((target("avx512f,avx512bf16,fma"))) float multiply_add_chains(long rounds) {
  const __m512bh half = (__m512bh)_mm512_set1_epi16(0x3F00);                  // 0.5 in bf16
  const __m512 decay = _mm512_set1_ps(0.999f), step = _mm512_set1_ps(1e-3f);  // converges to 1: no overflow
  __m512 acc[kChains];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  for (long r = 0; r < rounds; ++r)
#pragma GCC unroll 12
    for (__m512& a : acc) {
      if constexpr (kBf16)
        a = _mm512_dpbf16_ps(a, half, half);
      else
        a = _mm512_fmadd_ps(a, decay, step);
    }
  __m512 sum = _mm512_setzero_ps();
  for (const __m512& a : acc) sum = _mm512_add_ps(sum, a);
  // Summed through memory: GCC 12's _mm512_reduce_add_ps warns of an uninitialized register in its own header.
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  float total = 0;
  for (float lane : lanes) total += lane;
  return total;
}

// Seconds of one run of `loop`. Its result goes to a volatile, so that the loop cannot be dropped.
template <class Loop>
double seconds_of(Loop loop, long rounds) {
  const auto start = std::chrono::steady_clock::now();
  [[maybe_unused]] volatile float sink = loop(rounds);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

double measure_bf16_dot_product_rate() {
  if (!cpu_has_bf16_instructions()) return 0;
  constexpr long kRounds = 20000;  // 240,000 instructions: 0.1-0.3 ms a timing
  double bf16 = 1e30, float32 = 1e30;
  // The shortest of ten timings each, interleaved: preemption and the AVX-512 units' warm-up only ever add time,
  // and a slow stretch of the host weighs on both.
  for (int k = 0; k < 10; ++k) {
    bf16 = std::min(bf16, seconds_of(multiply_add_chains<true>, kRounds));
    float32 = std::min(float32, seconds_of(multiply_add_chains<false>, kRounds));
  }
  // A vdpbf16ps multiplies 32 bf16 pairs and adds them into 16 floats (64 flops), a 512-bit FMA makes 16
  // multiply-adds (32 flops).
  return (64 / bf16) / (32 / float32);
}

double cpu_bf16_dot_product_rate() {
  static const double rate = measure_bf16_dot_product_rate();
  return rate;
}

namespace {

// AMX-BF16 tiles the OS lets programs use: CPUID leaf 7's EDX bit 22, and the tile state (bits 17 and 18) enabled in
// XCR0 (Linux further has each process request the tiles, which oneDNN does). Read by hand: clang 14, which builds
// the fuzzers, has no "amx-bf16" for __builtin_cpu_supports. Only asked on AVX-512 CPUs, which have XGETBV.
bool cpu_has_amx_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !(edx & (1u << 22))) return false;
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  const unsigned tile_state = 3u << 17;
  return (xcr0_low & tile_state) == tile_state;
}

}  // namespace

bool cpu_has_fast_bf16() {
  static const bool fast =
      cpu_has_bf16_instructions() && (cpu_has_amx_bf16() || cpu_bf16_dot_product_rate() >= kFastBf16DotProductRate);
  return fast;
}

namespace {

int widest_vector_bits() { return __builtin_cpu_supports("avx512f") ? 512 : 256; }

std::atomic<int> g_vector_bits{widest_vector_bits()};

}  // namespace

bool cpu_has_avx2_fma() {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return avx2;
}

int kernel_vector_bits() { return g_vector_bits.load(); }

void set_kernel_vector_bits(int bits) {
  SD_CHECK(bits == 256 || (bits == 512 && widest_vector_bits() == 512),
           "vector width {} bits: expected 256 or, on a CPU with AVX-512F, 512", bits);
  g_vector_bits = bits;
}

}  // namespace sd
