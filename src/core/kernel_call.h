// Calling the kernels that core/simd_each_width.inl compiles once per vector width: the call goes to the width this
// CPU's kernels run (sd::kernel_vector_bits), and bf16 tensors pass their values as the kernels read them, as bits.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <type_traits>

#include "core/cpu_features.h"

// fn(args...) from namespace avx512 or avx2 of the including file, whichever width this CPU's kernels run. (A
// template-argument list with a comma needs parentheses around fn.)
#define SD_CALL_KERNEL(fn, ...) (::sd::kernel_vector_bits() == 512 ? avx512::fn(__VA_ARGS__) : avx2::fn(__VA_ARGS__))

namespace sd {

// A bf16 tensor's values as their 16-bit patterns.
inline const uint16_t* bf16_bits(const at::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr<c10::BFloat16>());
}
inline uint16_t* bf16_bits(at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<c10::BFloat16>()); }

// A float32 or bf16 tensor's values as kernels templated on their element type T read them: float, or uint16_t (bf16
// bits). with_kernel_values(dtype, f) calls f(T{}) for the T of dtype (float32 or bf16), so one body serves both:
//   with_kernel_values(x.scalar_type(), [&](auto type) { kernel(kernel_values<decltype(type)>(x), ...); });
template <typename T>
T* kernel_values(const at::Tensor& t) {
  if constexpr (std::is_same_v<T, uint16_t>)
    return reinterpret_cast<uint16_t*>(t.data_ptr<c10::BFloat16>());
  else
    return t.data_ptr<float>();
}
template <typename F>
decltype(auto) with_kernel_values(at::ScalarType dtype, F&& f) {
  return dtype == at::kBFloat16 ? f(uint16_t{}) : f(float{});
}

}  // namespace sd
