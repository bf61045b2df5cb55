// What a constant blended in under an AVX-512 mask costs when the mask is empty, in the three forms a compiler can give
// it: a masked load from a page nothing has read (so nothing has mapped), a masked load from a mapped page, and a blend
// from a register (sd::simd::avx512::in_register). The first is what GCC made of canonical_nans in AdamW's pass: on the
// Zen 5 host each execution took a fault-suppression assist, and whole SD-1.5 runs stepped at ~9.5 s instead of ~1.6
// (docs/benchmarks.md, fifty-fourth sitting; scripts/check-masked-constant-loads keeps such loads out of the binary).
// A stream of 2^24 floats goes through the blend and is stored; JSON: median ns per 16-lane vector of each form.
//   bench_masked_constant
#include <immintrin.h>
#include <sys/mman.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench_util.h"

namespace {

constexpr int64_t kValues = int64_t{1} << 24;

// out = in with NaN lanes replaced by *constant, the replacement read from memory under the NaN mask.
__attribute__((target("avx512f"), noinline)) void blend_from_memory(const float* in, float* out,
                                                                    const float* constant) {
  for (int64_t i = 0; i < kValues; i += 16) {
    __m512 x = _mm512_loadu_ps(in + i);
    const __mmask16 nan_lanes = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    asm volatile("vbroadcastss (%1), %0%{%2%}" : "+v"(x) : "r"(constant), "Yk"(nan_lanes));
    _mm512_storeu_ps(out + i, x);
  }
}

__attribute__((target("avx512f"), noinline)) void blend_from_register(const float* in, float* out, float constant) {
  __m512 replacement = _mm512_set1_ps(constant);
  asm("" : "+v"(replacement));
  for (int64_t i = 0; i < kValues; i += 16) {
    const __m512 x = _mm512_loadu_ps(in + i);
    _mm512_storeu_ps(out + i, _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x, replacement));
  }
}

// A fresh anonymous page: mapped only once something reads or writes it.
float* fresh_page() {
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  SD_CHECK(page != MAP_FAILED, "bench_masked_constant: mmap of one page failed");
  return static_cast<float*>(page);
}

}  // namespace

int main() {
  if (!__builtin_cpu_supports("avx512f")) {
    std::printf("%s\n", nlohmann::json{{"skipped", "this CPU has no AVX-512"}}.dump().c_str());
    return 0;
  }
  std::vector<float> in(kValues, 1.f), out(kValues);  // no NaN: every mask is empty
  float* unmapped = fresh_page();
  float* mapped = fresh_page();
  mapped[0] = 0.f;
  const auto ns_per_vector = [](const sd::bench::Timing& t) { return t.median_s * 1e9 / (kValues / 16); };
  const auto never_read = sd::bench::time_it([&] { blend_from_memory(in.data(), out.data(), unmapped); }, 1, 5);
  const auto read = sd::bench::time_it([&] { blend_from_memory(in.data(), out.data(), mapped); }, 1, 5);
  const auto in_register = sd::bench::time_it([&] { blend_from_register(in.data(), out.data(), 0.f); }, 1, 5);
  const nlohmann::json result = {{"cpu", sd::perf::cpu_model_name()},
                                 {"masked_load_unmapped_page_ns_per_vector", ns_per_vector(never_read)},
                                 {"masked_load_mapped_page_ns_per_vector", ns_per_vector(read)},
                                 {"register_blend_ns_per_vector", ns_per_vector(in_register)}};
  std::printf("%s\n", result.dump().c_str());
}
