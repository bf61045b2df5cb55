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

#include "core/error.h"
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

// c (row-major [M, N]) = a·b, plus what c holds when `accumulate`: addmm_impl_cpu_'s sgemm_ call, B's layout first.
void multiply_into(const Matrix& a, const Matrix& b, float* c, bool accumulate) {
  const int m = static_cast<int>(a.rows), n = static_cast<int>(b.cols), k = static_cast<int>(a.cols);
  const BlasLayout la = *blas_layout(a), lb = *blas_layout(b);
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  sgemm_(&lb.trans, &la.trans, &n, &m, &k, &alpha, b.data, &lb.ld, a.data, &la.ld, &beta, c, &n);
}

// With a bias, addmm copies its expanded input into the result and adds the product to it (beta 1); these fill a
// row-major [rows, cols] the same way, the bias [cols] on every row or the bias [rows] down every column.
void fill_rows_with(const float* bias, int64_t rows, int64_t cols, float* out) {
  for (int64_t row = 0; row < rows; ++row) std::copy_n(bias, cols, out + row * cols);
}
void fill_columns_with(const float* bias, int64_t rows, int64_t cols, float* out) {
  for (int64_t row = 0; row < rows; ++row) std::fill_n(out + row * cols, cols, bias[row]);
}

// a·b (+ bias on every row) into a new row-major [M, N].
at::Tensor product(const Matrix& a, const Matrix& b, const at::Tensor& bias, const at::TensorOptions& options) {
  at::Tensor c = at::empty({a.rows, b.cols}, options);
  if (bias.defined()) fill_rows_with(bias.data_ptr<float>(), a.rows, b.cols, c.data_ptr<float>());
  multiply_into(a, b, c.data_ptr<float>(), bias.defined());
  return c;
}

Matrix sample_of(const at::Tensor& batch, int64_t s) {
  return {batch.data_ptr<float>() + s * batch.stride(0), batch.size(1), batch.size(2), batch.stride(1),
          batch.stride(2)};
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

bool float32_per_sample_fits(const at::Tensor& a, const at::Tensor& b) {
  return float32_cpu_matrix(a) && b.dim() == 3 && b.scalar_type() == at::kFloat && b.is_cpu() && b.size(0) > 0 &&
         product_fits(as_is(a), sample_of(b, 0));
}

at::Tensor float32_addmm_per_sample(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b) {
  SD_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == a.size(0) && bias.scalar_type() == at::kFloat &&
                               bias.is_contiguous()),
           "float32_addmm_per_sample: expected a contiguous float32 bias of {} values, got [{}] {}", a.size(0),
           fmt::join(bias.sizes(), ", "), bias.defined() ? c10::toString(bias.scalar_type()) : "");
  // One scope for the batch (perf/op_profiler.cpp counts b [S, K, N] as S·N columns).
  RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::mm", std::vector<c10::IValue>({a, b, false}));
  const int64_t samples = b.size(0), m = a.size(0), n = b.size(2);
  at::Tensor c = at::empty({samples, m, n}, a.options());
  for (int64_t s = 0; s < samples; ++s) {
    float* out = c.data_ptr<float>() + s * m * n;
    if (bias.defined()) fill_columns_with(bias.data_ptr<float>(), m, n, out);
    multiply_into(as_is(a), sample_of(b, s), out, bias.defined());
  }
  return c;
}

}  // namespace sd
