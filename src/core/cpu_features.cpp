#include "core/cpu_features.h"

#include <atomic>

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

bool cpu_has_fast_bf16() {
  static const bool fast = cpu_runs_bf16_in_onednn() && __builtin_cpu_supports("avx512bf16");
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
