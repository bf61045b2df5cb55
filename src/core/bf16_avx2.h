// bf16 <-> float32 for eight values at a time in AVX2, for sdtrain's own memory-bound kernels (AdamW, the gradient
// norm). Callers must themselves be compiled for AVX2 (`__attribute__((target("avx2,fma")))`).
#pragma once
#include <c10/util/BFloat16.h>
#include <immintrin.h>

namespace sd {

// Eight bf16 values widened exactly to float32 (a bf16 is the high half of a float32).
__attribute__((target("avx2,fma"))) inline __m256 load8_bf16(const c10::BFloat16* x) {
  const __m256i widened = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(widened, 16));
}

}  // namespace sd
