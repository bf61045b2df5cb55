// Compiles the kernel file named by SD_KERNELS once per vector width: into namespace avx2 for AVX2 and into namespace
// avx512 for AVX-512, each inside its target region and seeing that width's operations (core/simd.h). Include it
// where those namespaces belong, after `#define SD_KERNELS "models/....inl"`:
//   #define SD_KERNELS "models/wide_head_softmax_rows.inl"
//   #include "core/simd_each_width.inl"
// and call the kernels through SD_CALL_KERNEL (core/kernel_call.h), which picks the width this CPU runs. Not a header
// of its own: every inclusion defines both namespaces again.
#ifndef SD_KERNELS
#error "define SD_KERNELS as the kernel file to include once per vector width"
#endif

namespace avx2 {
SD_BEGIN_AVX2
using namespace sd::simd::avx2;
#include SD_KERNELS
SD_END_TARGET
}  // namespace avx2

namespace avx512 {
SD_BEGIN_AVX512
using namespace sd::simd::avx512;
#include SD_KERNELS
SD_END_TARGET
}  // namespace avx512

#undef SD_KERNELS
