#include "train/precision.h"

#include <utility>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/log.h"

namespace sd::train {

PrecisionPolicy PrecisionPolicy::from_flag(const std::string& mixed_precision) {
  if (mixed_precision == "no") return {};
  SD_CHECK(mixed_precision == "bf16" || mixed_precision == "fp16",
           "--mixed_precision: expected no, fp16 or bf16, got '{}'", mixed_precision);
  if (mixed_precision == "fp16")
    log::info(
        "note: --mixed_precision fp16: CPUs have no fast float16 kernels; bf16 is used instead (same memory, "
        "float32's range)");
  if (!cpu_runs_bf16_natively()) {
    static bool announced = false;
    if (!std::exchange(announced, true))
      log::info(
          "note: --mixed_precision {}: this CPU lacks AVX-512 (BW/VL/DQ), so LibTorch would run bf16 matmuls and "
          "convolutions ~15x slower than float32 and sum them in bf16; computing in float32 instead",
          mixed_precision);
    return {};
  }
  return {at::kBFloat16, at::kBFloat16, at::kFloat};
}

}  // namespace sd::train
