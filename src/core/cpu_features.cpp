#include "core/cpu_features.h"

namespace sd {

bool cpu_runs_bf16_in_onednn() {
  static const bool onednn =
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return onednn;
}

bool cpu_has_fast_bf16() {
  static const bool fast = cpu_runs_bf16_in_onednn() && __builtin_cpu_supports("avx512bf16");
  return fast;
}

}  // namespace sd
