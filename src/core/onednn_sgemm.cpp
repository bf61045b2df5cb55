// LibTorch's float32 GEMMs (linear layers, their gradients, bmm) go through the Fortran BLAS entry sgemm_, which
// Debian's libtorch resolves to OpenBLAS. sdtrain keeps OpenBLAS single-threaded (core/threads.h: its own thread
// pool fights LibTorch's OpenMP threads for the cores), so every such GEMM ran on one core. Defining sgemm_ in the
// executable interposes it for libtorch_cpu (the dynamic linker binds a library's undefined symbol to the
// executable's definition first): the GEMM then runs in oneDNN, which LibTorch already links for its convolutions
// and which threads over the same OpenMP pool (one thread when called inside a parallel region).
#include "core/onednn_sgemm.h"

#include <ATen/record_function.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <optional>

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

namespace {

// A float32 matrix as a product reads it: the tensor's sizes and strides, or its transpose's (swapped here rather
// than in a view).
struct Matrix {
  const float* data;
  int64_t rows, cols, row_stride, col_stride;
};

Matrix as_is(const at::Tensor& t) { return {t.data_ptr<float>(), t.size(0), t.size(1), t.stride(0), t.stride(1)}; }
Matrix transposed(const at::Tensor& t) { return {t.data_ptr<float>(), t.size(1), t.size(0), t.stride(1), t.stride(0)}; }

// How column-major BLAS reads a row-major operand, as addmm_impl_cpu_ describes it for a row-major result (which it
// computes as Cᵀ = Bᵀ·Aᵀ): 'N' with the row stride as leading dimension when the rows are contiguous, else 'T' with
// the column stride when the columns are; neither, and LibTorch would copy it first (not taken here).
struct BlasLayout {
  char trans;
  int ld;
};
std::optional<BlasLayout> blas_layout(const Matrix& t) {
  if (t.col_stride == 1 && t.row_stride >= t.cols && t.row_stride <= INT_MAX)
    return BlasLayout{'N', static_cast<int>(t.row_stride)};
  if (t.row_stride == 1 && t.col_stride >= t.rows && t.col_stride <= INT_MAX)
    return BlasLayout{'T', static_cast<int>(t.col_stride)};
  return std::nullopt;
}

bool float32_cpu_matrix(const at::Tensor& t) { return t.dim() == 2 && t.scalar_type() == at::kFloat && t.is_cpu(); }

bool product_fits(const Matrix& a, const Matrix& b) {
  return a.cols == b.rows && std::min({a.rows, a.cols, b.cols}) > 1 && std::max({a.rows, a.cols, b.cols}) <= INT_MAX &&
         blas_layout(a) && blas_layout(b);
}

bool bias_fits(const at::Tensor& bias, int64_t n) {
  return !bias.defined() || (bias.dim() == 1 && bias.size(0) == n && bias.scalar_type() == at::kFloat &&
                             bias.is_cpu() && bias.is_contiguous());
}

// a·b (+ bias on every row) into a new row-major [M, N]: addmm_impl_cpu_'s sgemm_ call, B's layout first. With a
// bias the output starts as the bias on every row and the product is added to it (beta 1), as addmm copies its
// expanded input into the result first.
at::Tensor product(const Matrix& a, const Matrix& b, const at::Tensor& bias, const at::TensorOptions& options) {
  const int m = static_cast<int>(a.rows), n = static_cast<int>(b.cols), k = static_cast<int>(a.cols);
  at::Tensor c = at::empty({m, n}, options);
  float* out = c.data_ptr<float>();
  if (bias.defined()) {
    const float* values = bias.data_ptr<float>();
    for (int row = 0; row < m; ++row) std::copy_n(values, n, out + static_cast<int64_t>(row) * n);
  }
  const BlasLayout la = *blas_layout(a), lb = *blas_layout(b);
  const float alpha = 1.f, beta = bias.defined() ? 1.f : 0.f;
  sgemm_(&lb.trans, &la.trans, &n, &m, &k, &alpha, b.data, &lb.ld, a.data, &la.ld, &beta, out, &n);
  return c;
}

}  // namespace

bool float32_matmul_fits(const at::Tensor& a, const at::Tensor& b) {
  return float32_cpu_matrix(a) && float32_cpu_matrix(b) && product_fits(as_is(a), as_is(b));
}

at::Tensor float32_matmul(const at::Tensor& a, const at::Tensor& b) {
  // What at::mm would show the profiler (perf/op_profiler.h: the linear class and its FLOPs).
  RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::mm", std::vector<c10::IValue>({a, b, false}));
  return product(as_is(a), as_is(b), at::Tensor(), a.options());
}

bool float32_linear_fits(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return float32_cpu_matrix(x) && float32_cpu_matrix(weight) && product_fits(as_is(x), transposed(weight)) &&
         bias_fits(bias, weight.size(0));
}

at::Tensor float32_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::mm", std::vector<c10::IValue>({x, weight, true}));
  return product(as_is(x), transposed(weight), bias, x.options());
}

}  // namespace sd
