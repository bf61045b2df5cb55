#include "train/gradient_norm.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "core/bf16_avx2.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/simd.h"

namespace sd::train {
namespace {

// Sixteen values a turn into four double accumulators: four independent chains of fused multiply-adds keep the
// pass at memory speed (with one chain per half-vector it waited on the adds, at half of it).
__attribute__((target("avx2,fma"))) __m256d squares_added(__m128 v, __m256d sum) {
  const __m256d d = _mm256_cvtps_pd(v);
  return _mm256_fmadd_pd(d, d, sum);
}

__attribute__((target("avx2,fma"))) double sum_of_squares_avx2(const c10::BFloat16* x, int64_t begin, int64_t end) {
  __m256d sums[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m256 a = load8_bf16(x + i), b = load8_bf16(x + i + 8);
    sums[0] = squares_added(_mm256_castps256_ps128(a), sums[0]);
    sums[1] = squares_added(_mm256_extractf128_ps(a, 1), sums[1]);
    sums[2] = squares_added(_mm256_castps256_ps128(b), sums[2]);
    sums[3] = squares_added(_mm256_extractf128_ps(b, 1), sums[3]);
  }
  alignas(32) double parts[4];
  _mm256_store_pd(parts, _mm256_add_pd(_mm256_add_pd(sums[0], sums[1]), _mm256_add_pd(sums[2], sums[3])));
  double sum = parts[0] + parts[1] + parts[2] + parts[3];
  for (; i < end; ++i) sum += static_cast<double>(static_cast<float>(x[i])) * static_cast<float>(x[i]);
  return sum;
}

// Sixty-four values a turn into eight float64 chains: 512-bit units widen and add twice AVX2's values a cycle, and
// eight chains cover the adds' latency on both FMA pipes (`build/bench_optimizer 200 1`, Zen 5: AVX2 0.027 s, four
// chains 0.020, eight 0.016). The pass is bound by these instructions, not by memory.
SD_BEGIN_AVX512
__m512d squares_added(__m256 v, __m512d sum) {
  const __m512d d = _mm512_cvtps_pd(v);
  return _mm512_fmadd_pd(d, d, sum);
}

double sum_of_squares_avx512(const c10::BFloat16* x, int64_t begin, int64_t end) {
  __m512d sums[8];
  for (__m512d& sum : sums) sum = _mm512_setzero_pd();
  int64_t i = begin;
  for (; i + 64 <= end; i += 64)
    for (int part = 0; part < 4; ++part) {
      const __m512 v = simd::avx512::load(reinterpret_cast<const uint16_t*>(x + i + 16 * part));
      sums[2 * part] = squares_added(_mm512_castps512_ps256(v), sums[2 * part]);
      sums[2 * part + 1] =
          squares_added(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)), sums[2 * part + 1]);
    }
  for (int k = 4; k > 0; k /= 2)
    for (int j = 0; j < k; ++j) sums[j] = _mm512_add_pd(sums[j], sums[j + k]);
  double sum = _mm512_reduce_add_pd(sums[0]);
  for (; i < end; ++i) sum += static_cast<double>(static_cast<float>(x[i])) * static_cast<float>(x[i]);
  return sum;
}
SD_END_TARGET

double sum_of_squares(const c10::BFloat16* x, int64_t begin, int64_t end) {
  if (kernel_vector_bits() == 512) return sum_of_squares_avx512(x, begin, end);
  if (cpu_has_avx2_fma()) return sum_of_squares_avx2(x, begin, end);
  double sum = 0;
  for (int64_t i = begin; i < end; ++i) sum += static_cast<double>(static_cast<float>(x[i])) * static_cast<float>(x[i]);
  return sum;
}

}  // namespace

double squared_l2_norm(const at::Tensor& gradient) {
  if (gradient.scalar_type() != at::kBFloat16) {
    const double norm = at::norm(gradient, 2).item<double>();
    return norm * norm;
  }
  SD_CHECK(gradient.is_contiguous(), "squared_l2_norm: a bf16 gradient must be contiguous");
  const c10::BFloat16* x = gradient.data_ptr<c10::BFloat16>();
  // Per chunk of 2^16 values, then over the chunks in their order: the same sum whatever the threads.
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int64_t chunks = (gradient.numel() + kChunk - 1) / kChunk;
  std::vector<double> sums(chunks, 0.0);
  sd::parallel_for(0, chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c)
      sums[c] = sum_of_squares(x, c * kChunk, std::min(gradient.numel(), (c + 1) * kChunk));
  });
  double total = 0;
  for (double s : sums) total += s;
  return total;
}

double sum_of_squared_l2_norms(const std::vector<at::Tensor>& pieces) {
  // Threads get runs of consecutive pieces of about equal elements: a piece belongs to the run holding its first.
  std::vector<int64_t> starts(pieces.size() + 1, 0);
  for (size_t i = 0; i < pieces.size(); ++i) starts[i + 1] = starts[i] + pieces[i].numel();
  std::vector<double> squares(pieces.size(), 0.0);
  sd::parallel_for(0, starts.back(), 1 << 16, [&](int64_t begin, int64_t end) {
    const size_t first = std::lower_bound(starts.begin(), starts.end() - 1, begin) - starts.begin();
    for (size_t i = first; i < pieces.size() && starts[i] < end; ++i)
      if (pieces[i].numel() > 0) squares[i] = squared_l2_norm(pieces[i]);
  });
  double total = 0;
  for (double s : squares) total += s;
  return total;
}

}  // namespace sd::train
