// Vector operations on float32 (loading and storing bf16 too) for sdtrain's own kernels (attention, norms, AdamW), once
// per instruction set: AVX2's eight lanes in sd::simd::avx2 and AVX-512's sixteen in sd::simd::avx512. A kernel
// written once against these names (`Vec`, `kLanes`, load, store, exp, ...) is compiled for each set by
// core/simd_each_width.inl, which includes it between SD_BEGIN_AVX2 (or SD_BEGIN_AVX512) and SD_END_TARGET in a
// namespace that uses this width's operations; the CPU decides at run time which runs (sd::kernel_vector_bits in
// core/cpu_features.h).
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#define SD_INLINE __attribute__((always_inline)) inline

// The target regions: GCC's `target` pragma, clang's `attribute push` (the fuzz build uses clang). GCC 12's AVX-512
// intrinsics start from _mm512_undefined_*(), which it then reports as used uninitialized (GCC bug 105593, fixed in
// GCC 13): false positives at every inlined intrinsic, silenced inside the regions.
#ifdef __clang__
#define SD_BEGIN_TARGET(isa) \
  _Pragma(SD_STRINGIFY(clang attribute push(__attribute__((target(isa))), apply_to = function)))
#define SD_END_TARGET _Pragma("clang attribute pop")
#else
#define SD_BEGIN_TARGET(isa)                                                                        \
  _Pragma("GCC push_options") _Pragma(SD_STRINGIFY(GCC target(isa))) _Pragma("GCC diagnostic push") \
      _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")                                         \
          _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define SD_END_TARGET _Pragma("GCC diagnostic pop") _Pragma("GCC pop_options")
#endif
#define SD_STRINGIFY(x) #x
#define SD_BEGIN_AVX2 SD_BEGIN_TARGET("avx2,fma")
#define SD_BEGIN_AVX512 SD_BEGIN_TARGET("avx512f,avx2,fma")

namespace sd::simd {

// exp(x) in both: Cephes' expf (x = n·ln2 + r with |r| ≤ ln2/2, 2^n from the exponent bits, e^r from a degree-7
// polynomial), within 2 ulp of std::exp. Below -87.3, where float32's exp leaves the normal range, and for -inf it
// gives 0; NaN stays NaN (min and max return their second operand when one is NaN).
constexpr float kExpLowest = -87.3f, kExpHighest = 88.3f, kLog2e = 1.44269504088896341f;
constexpr float kLn2High = 0.693359375f, kLn2Low = -2.12194440e-4f;  // ln2 split so that n·kLn2High is exact
constexpr float kExpPolynomial[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                    4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

namespace avx2 {
SD_BEGIN_AVX2

using Vec = __m256;
constexpr int64_t kLanes = 8;

// Loads and stores are unaligned; min and max return their second operand when one is NaN.
SD_INLINE Vec load(const float* p) { return _mm256_loadu_ps(p); }
SD_INLINE void store(float* p, Vec x) { _mm256_storeu_ps(p, x); }
SD_INLINE Vec splat(float x) { return _mm256_set1_ps(x); }
SD_INLINE Vec zero() { return _mm256_setzero_ps(); }
SD_INLINE Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
SD_INLINE Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
SD_INLINE Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
SD_INLINE Vec div(Vec a, Vec b) { return _mm256_div_ps(a, b); }
SD_INLINE Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
SD_INLINE Vec fnmadd(Vec a, Vec b, Vec c) { return _mm256_fnmadd_ps(a, b, c); }
SD_INLINE Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
SD_INLINE Vec sqrt(Vec x) { return _mm256_sqrt_ps(x); }
// x as rounded where it was computed: GCC (GNU mode, -ffp-contract=fast) fuses a product into a following add or
// subtract, one rounding instead of the two a reference computing op by op makes; this keeps them apart.
SD_INLINE Vec kept_rounded(Vec x) {
  asm("" : "+x"(x));
  return x;
}
// x with its NaN lanes the quiet NaN 0x7FC00000, which a bf16 store rounds to 0x7FC0 as c10::BFloat16 does (a NaN
// whose low payload is all ones would otherwise carry into the sign).
SD_INLINE Vec canonical_nans(Vec x) {
  return _mm256_blendv_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
// Per lane: `negative` where x < 0, else `otherwise` (-0 and NaN take `otherwise`).
SD_INLINE Vec select_where_negative(Vec x, Vec negative, Vec otherwise) {
  return _mm256_blendv_ps(otherwise, negative, _mm256_cmp_ps(x, zero(), _CMP_LT_OQ));
}

SD_INLINE Vec exp(Vec x) {
  const Vec underflows = _mm256_cmp_ps(x, splat(kExpLowest), _CMP_LT_OQ);
  x = _mm256_min_ps(splat(kExpHighest), max(splat(kExpLowest), x));
  const Vec n = _mm256_round_ps(mul(x, splat(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const Vec r = fnmadd(n, splat(kLn2Low), fnmadd(n, splat(kLn2High), x));
  Vec p = splat(kExpPolynomial[0]);
  for (int i = 1; i < 6; ++i) p = fmadd(p, r, splat(kExpPolynomial[i]));
  p = fmadd(p, mul(r, r), add(r, splat(1.f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflows, mul(p, _mm256_castsi256_ps(exponent)));
}

// x rounded to the nearest bf16 (ties to even) and widened back, as storing to bf16 and loading again would.
SD_INLINE Vec round_to_bf16(Vec x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  return _mm256_castsi256_ps(_mm256_and_si256(rounded, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

SD_INLINE float horizontal_sum(Vec x) {
  const __m128 pairs = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 twos = _mm_add_ps(pairs, _mm_movehl_ps(pairs, pairs));
  return _mm_cvtss_f32(_mm_add_ss(twos, _mm_movehdup_ps(twos)));
}

SD_INLINE float horizontal_max(Vec x) {
  const __m128 pairs = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 twos = _mm_max_ps(pairs, _mm_movehl_ps(pairs, pairs));
  return _mm_cvtss_f32(_mm_max_ss(twos, _mm_movehdup_ps(twos)));
}

// x with the lanes of keys first, first + 1, ... at or past `keys` set to -inf.
SD_INLINE Vec minus_infinity_past(Vec x, int64_t first, int64_t keys) {
  const Vec lane = add(splat(static_cast<float>(first)), _mm256_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f));
  return _mm256_blendv_ps(x, splat(-INFINITY), _mm256_cmp_ps(lane, splat(static_cast<float>(keys)), _CMP_GE_OQ));
}

// The first `count` (0 ... 7) lanes from p, `fill` in the others; and storing only those lanes.
SD_INLINE __m256i first_lanes(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
SD_INLINE Vec load_first(const float* p, int64_t count, float fill) {
  const __m256i lanes = first_lanes(count);
  return _mm256_blendv_ps(splat(fill), _mm256_maskload_ps(p, lanes), _mm256_castsi256_ps(lanes));
}
SD_INLINE void store_first(float* p, Vec x, int64_t count) { _mm256_maskstore_ps(p, first_lanes(count), x); }

// bf16 values, as their bits: loaded widened to float32; stored rounded to the nearest (ties to even, as
// c10::BFloat16 rounds everything but NaN payloads); the _first forms as for float32.
SD_INLINE Vec load(const uint16_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
SD_INLINE void store(uint16_t* p, Vec x) {
  const __m256i high = _mm256_srli_epi32(_mm256_castps_si256(round_to_bf16(x)), 16);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(high, high), 0b1000);  // packs per 128 bits
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
// As store(), with a non-temporal store (p aligned to kLanes · 2 bytes): for an array only written, whose cache lines
// need not be read first.
SD_INLINE void store_streaming(uint16_t* p, Vec x) {
  const __m256i high = _mm256_srli_epi32(_mm256_castps_si256(round_to_bf16(x)), 16);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(high, high), 0b1000);
  _mm_stream_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
SD_INLINE Vec load_first(const uint16_t* p, int64_t count, float fill) {
  uint16_t lanes[kLanes] = {};
  std::memcpy(lanes, p, count * sizeof(uint16_t));
  return _mm256_blendv_ps(splat(fill), load(lanes), _mm256_castsi256_ps(first_lanes(count)));
}
SD_INLINE void store_first(uint16_t* p, Vec x, int64_t count) {
  uint16_t lanes[kLanes];
  store(lanes, x);
  std::memcpy(p, lanes, count * sizeof(uint16_t));
}

SD_END_TARGET
}  // namespace avx2

namespace avx512 {
SD_BEGIN_AVX512

using Vec = __m512;
constexpr int64_t kLanes = 16;

SD_INLINE Vec load(const float* p) { return _mm512_loadu_ps(p); }
SD_INLINE void store(float* p, Vec x) { _mm512_storeu_ps(p, x); }
SD_INLINE Vec splat(float x) { return _mm512_set1_ps(x); }
SD_INLINE Vec zero() { return _mm512_setzero_ps(); }
SD_INLINE Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
SD_INLINE Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
SD_INLINE Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
SD_INLINE Vec div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
SD_INLINE Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
SD_INLINE Vec fnmadd(Vec a, Vec b, Vec c) { return _mm512_fnmadd_ps(a, b, c); }
SD_INLINE Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
SD_INLINE Vec sqrt(Vec x) { return _mm512_sqrt_ps(x); }
SD_INLINE Vec kept_rounded(Vec x) {
  asm("" : "+v"(x));
  return x;
}
// A constant the compiler must hold in a register. Blended in under a mask, GCC otherwise folds it into a masked load
// from .rodata (vbroadcastss const, zmm{k}); where the mask is almost always empty (no NaN lanes, no padding) the
// constant's page may never be read, so never mapped, and each such load of an unmapped page takes a
// fault-suppression assist: ~170 ns a vector on the Zen 5 host, which made AdamW's pass 30x slower in whole runs
// (docs/benchmarks.md, fifty-fourth sitting). The masked_constant_loads test checks the binary for such loads.
SD_INLINE Vec in_register(Vec x) {
  asm("" : "+v"(x));
  return x;
}
SD_INLINE Vec canonical_nans(Vec x) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x,
                              in_register(_mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000))));
}
SD_INLINE Vec select_where_negative(Vec x, Vec negative, Vec otherwise) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, zero(), _CMP_LT_OQ), otherwise, negative);
}

SD_INLINE Vec exp(Vec x) {
  const __mmask16 underflows = _mm512_cmp_ps_mask(x, splat(kExpLowest), _CMP_LT_OQ);
  x = _mm512_min_ps(splat(kExpHighest), max(splat(kExpLowest), x));
  const Vec n = _mm512_roundscale_ps(mul(x, splat(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const Vec r = fnmadd(n, splat(kLn2Low), fnmadd(n, splat(kLn2High), x));
  Vec p = splat(kExpPolynomial[0]);
  for (int i = 1; i < 6; ++i) p = fmadd(p, r, splat(kExpPolynomial[i]));
  p = fmadd(p, mul(r, r), add(r, splat(1.f)));
  const __m512i exponent = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflows), mul(p, _mm512_castsi512_ps(exponent)));
}

SD_INLINE Vec round_to_bf16(Vec x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_castsi512_ps(_mm512_and_si512(rounded, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

SD_INLINE __m256 upper_half(Vec x) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)); }

// The halves' sum (or maximum), then AVX2's eight lanes: the same association as avx2's on each half.
SD_INLINE float horizontal_sum(Vec x) {
  return avx2::horizontal_sum(_mm256_add_ps(_mm512_castps512_ps256(x), upper_half(x)));
}

SD_INLINE float horizontal_max(Vec x) {
  return avx2::horizontal_max(_mm256_max_ps(_mm512_castps512_ps256(x), upper_half(x)));
}

SD_INLINE Vec minus_infinity_past(Vec x, int64_t first, int64_t keys) {
  const int64_t valid = keys - first;  // < 16 here
  const __mmask16 padding = static_cast<__mmask16>(valid <= 0 ? 0xFFFF : 0xFFFF << valid);
  return _mm512_mask_blend_ps(padding, x, in_register(splat(-INFINITY)));
}

// The first `count` (0 ... 15) lanes from p, `fill` in the others; and storing only those lanes.
SD_INLINE __mmask16 first_lanes(int64_t count) { return static_cast<__mmask16>((1u << count) - 1); }
SD_INLINE Vec load_first(const float* p, int64_t count, float fill) {
  return _mm512_mask_loadu_ps(splat(fill), first_lanes(count), p);
}
SD_INLINE void store_first(float* p, Vec x, int64_t count) { _mm512_mask_storeu_ps(p, first_lanes(count), x); }

SD_INLINE Vec load(const uint16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
SD_INLINE void store(uint16_t* p, Vec x) {
  const __m512i high = _mm512_srli_epi32(_mm512_castps_si512(round_to_bf16(x)), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(high));
}
SD_INLINE void store_streaming(uint16_t* p, Vec x) {
  const __m512i high = _mm512_srli_epi32(_mm512_castps_si512(round_to_bf16(x)), 16);
  _mm256_stream_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(high));
}
SD_INLINE Vec load_first(const uint16_t* p, int64_t count, float fill) {
  uint16_t lanes[kLanes] = {};
  std::memcpy(lanes, p, count * sizeof(uint16_t));
  return _mm512_mask_blend_ps(first_lanes(count), splat(fill), load(lanes));
}
SD_INLINE void store_first(uint16_t* p, Vec x, int64_t count) {
  uint16_t lanes[kLanes];
  store(lanes, x);
  std::memcpy(p, lanes, count * sizeof(uint16_t));
}

SD_END_TARGET
}  // namespace avx512

}  // namespace sd::simd
