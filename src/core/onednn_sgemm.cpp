// LibTorch's float32 GEMMs (linear layers, their gradients, bmm) go through the Fortran BLAS entry sgemm_, which
// Debian's libtorch resolves to OpenBLAS. sdtrain keeps OpenBLAS single-threaded (core/threads.h: its own thread
// pool fights LibTorch's OpenMP threads for the cores), so every such GEMM ran on one core. Defining sgemm_ in the
// executable interposes it for libtorch_cpu (the dynamic linker binds a library's undefined symbol to the
// executable's definition first): the GEMM then runs in oneDNN, which LibTorch already links for its convolutions
// and which threads over the same OpenMP pool (one thread when called inside a parallel region).
#include <oneapi/dnnl/dnnl.h>

#include <cstdlib>

#include "core/threads.h"

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc) {
  // Column-major C = op(A) op(B) is row-major Cᵀ = op(B)ᵀ op(A)ᵀ, and a column-major matrix read row-major is its
  // transpose: so the row-major call takes B before A, with m and n swapped.
  const dnnl_status_t status = dnnl_sgemm(*transb, *transa, *n, *m, *k, *alpha, b, *ldb, a, *lda, *beta, c, *ldc);
  // LibTorch checks shapes and leading dimensions before calling BLAS, so a failure here is a bug, not bad input.
  if (status != dnnl_success) std::abort();
}

namespace sd {

const char* float32_gemm_library() { return "oneDNN"; }

}  // namespace sd
