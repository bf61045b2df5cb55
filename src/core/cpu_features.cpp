#include "core/cpu_features.h"

namespace sd {

bool cpu_runs_bf16_natively() {
  static const bool native =
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return native;
}

}  // namespace sd
