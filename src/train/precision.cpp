#include "train/precision.h"

#include <cstdlib>
#include <string>
#include <utility>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/log.h"

namespace sd::train {
namespace {

// Why bf16 compute would be slower than float32 on this CPU, or "" where it is the faster one.
std::string why_bf16_is_slow_here() {
  if (!cpu_runs_bf16_in_onednn())
    return "this CPU lacks AVX-512 (BW/VL/DQ), so LibTorch would run bf16 matmuls and convolutions ~15x slower than "
           "float32 and sum them in bf16";
  if (!cpu_has_bf16_instructions())
    return "this CPU lacks bf16 instructions (AVX512_BF16), so oneDNN would emulate bf16 matmuls and convolutions "
           "at about a quarter of float32's speed";
  if (!cpu_has_fast_bf16())
    return fmt::format(
        "this CPU's bf16 dot products do {:.0f}% of its float32 multiply-adds' flops and it has no AMX, so bf16 "
        "matmuls and convolutions would be slower than float32",
        100 * cpu_bf16_dot_product_rate());
  return "";
}

// SDTRAIN_FORCE_BF16=1: compute in bf16 on an AVX-512 CPU where it is slow anyway, so that the bf16 path
// can be exercised (tests, CI) on such machines. Not on CPUs without AVX-512, whose bf16 fallback sums in bf16.
bool bf16_forced() {
  const char* value = std::getenv("SDTRAIN_FORCE_BF16");
  if (!value || !*value || std::string(value) == "0") return false;
  SD_CHECK(std::string(value) == "1", "SDTRAIN_FORCE_BF16: expected 1 or 0, got '{}'", value);
  return true;
}

// What runs instead of bf16 instructions, for the note: float32, or emulated bf16 where it was forced and can be.
const char* instead(bool force_asked) {
  if (!cpu_runs_bf16_in_onednn())
    return force_asked ? "computing in float32 instead (SDTRAIN_FORCE_BF16 needs AVX-512)"
                       : "computing in float32 instead";
  return force_asked ? "computing in bf16 anyway (SDTRAIN_FORCE_BF16)"
                     : "computing in float32 instead (SDTRAIN_FORCE_BF16=1 would force bf16)";
}

}  // namespace

PrecisionPolicy PrecisionPolicy::from_flag(const std::string& mixed_precision) {
  if (mixed_precision == "no") return {};
  SD_CHECK(mixed_precision == "bf16" || mixed_precision == "fp16",
           "--mixed_precision: expected no, fp16 or bf16, got '{}'", mixed_precision);
  if (mixed_precision == "fp16")
    log::info(
        "note: --mixed_precision fp16: CPUs have no fast float16 kernels; bf16 is used instead (same memory, "
        "float32's range)");
  const PrecisionPolicy bf16{at::kBFloat16, at::kBFloat16, at::kFloat};
  const bool force_asked = bf16_forced();
  const std::string why = why_bf16_is_slow_here();
  if (why.empty()) return bf16;
  static bool announced = false;
  if (!std::exchange(announced, true))
    log::info("note: --mixed_precision {}: {}; {}", mixed_precision, why, instead(force_asked));
  return force_asked && cpu_runs_bf16_in_onednn() ? bf16 : PrecisionPolicy{};
}

}  // namespace sd::train
