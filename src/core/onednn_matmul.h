// bf16 matrix products through oneDNN matmul primitives that are built once per shape and kept.
//
// LibTorch 1.13 runs a bf16 at::mm on CPU through ideep, which describes, looks up and wraps a oneDNN primitive on
// every call: 15-40 µs of overhead per product. On SD-1.5's GEMMs that is noise, but tiny-sd1's are a few µs of
// arithmetic each (e.g. [512, 64] x [64, 64]) and a textual-inversion step runs hundreds of them. Executing a kept
// primitive costs a few µs; the arithmetic is oneDNN's own either way, so the products are bit-identical to at::mm's.
#pragma once
#include <ATen/ATen.h>

#include <memory>

namespace sd {

// Whether onednn_matmul takes these operands: 2-D bf16 CPU tensors a [M, K] and b [K, N], each row-major or
// column-major (a transposed view), with M·K·N above 16³, on a CPU that runs bf16 in oneDNN: the products at::mm
// itself runs in oneDNN.
bool onednn_matmul_fits(const at::Tensor& a, const at::Tensor& b);

// a·b, plus `bias` [N] (or undefined) on every row, summed in float32 and rounded to bf16 once, as at::addmm does.
// The operands must fit (onednn_matmul_fits); the result is a new contiguous [M, N] tensor.
at::Tensor onednn_matmul(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias = {});

// a·b plus `bias` [M] down every column, as at::addmm(bias.unsqueeze(1), a, b) computes it, to the bit, for b of
// two columns or more (with one, at::addmm's own result depends on a's layout): a GEMM convolution's weight times
// its columns, plus its bias. The operands must fit (onednn_matmul_fits).
at::Tensor onednn_addmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b);

// Whether the products of each sample take a and b, one of them a batch [S, ., .] and the other a matrix: as
// onednn_matmul_fits takes a sample and the matrix, with two columns or more. onednn_addmm_per_sample's a [M, K] and
// b [S, K, N]; PackedMatrix::times' a [S, M, K] and b [K, N].
bool onednn_per_sample_fits(const at::Tensor& a, const at::Tensor& b);

// onednn_addmm(bias, a, b[s]) for each sample s of b [S, K, N], written to the new [S, M, N]: a GEMM convolution's
// weight times each image's columns, landing as the layer's maps, where one product over the batch's [K, S·N]
// columns needs a copy into that matrix and another out of it.
at::Tensor onednn_addmm_per_sample(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b);

// The same for a linear layer's x·weightᵀ + bias, x [M, K] and weight [N, K], without building weight's transposed
// view: onednn_linear(x, w, bias) is onednn_matmul(x, w.t(), bias).
bool onednn_linear_fits(const at::Tensor& x, const at::Tensor& weight);
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

// a·b through onednn_matmul or float32_matmul (core/onednn_sgemm.h) where the operands fit, else at::mm: the same
// product either way.
at::Tensor mm(const at::Tensor& a, const at::Tensor& b);

// A matrix that stays the same from one product to the next (a frozen layer's weight), kept in the blocked layout
// oneDNN's bf16 kernels read. at::mm and onednn_matmul reorder their right operand into that layout on every call,
// which is most of the cost where the left one has few rows: on SD-1.5's 4x4 maps, [16, 1280] x [1280, 11520] runs
// at 147 GFLOP/s through at::mm and 316 from the packed matrix (bench_gemm). The products are the same, to the bit.
class PackedMatrix {
 public:
  PackedMatrix();
  ~PackedMatrix();
  PackedMatrix(const PackedMatrix&) = delete;
  PackedMatrix& operator=(const PackedMatrix&) = delete;

  // a·b, as onednn_matmul(a, b) computes it, for a [M, K] (the operands fit onednn_matmul_fits), or a[s]·b for
  // each sample of a [S, M, K] into [S, M, N] (they fit onednn_per_sample_fits). b is packed on the first call and
  // again when it has changed since (another storage or layout, or written in place, which bumps its version: b
  // must change only through LibTorch) or the product asks for another blocking.
  at::Tensor times(const at::Tensor& a, const at::Tensor& b);
  // The packed copy's size (0 before the first product).
  int64_t bytes() const;

 private:
  struct Packing;
  std::unique_ptr<Packing> packing_;
};

// Row-major C = alpha · op(A) op(B) + beta · C on bf16 A and B, with dnnl_sgemm's arguments (op 'N' or 'T', leading
// dimensions): into float32 C, beta 0 or 1, or into bf16 C, beta 0 (summed in float32, rounded once). A kept
// primitive per shape for the calling thread, as onednn_matmul; inside a parallel region it runs on the calling
// thread alone. The attention kernels' products (models/wide_head_attention.cpp).
void gemm_bf16(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k, float alpha, const c10::BFloat16* a,
               int64_t lda, const c10::BFloat16* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm_bf16(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k, float alpha, const c10::BFloat16* a,
               int64_t lda, const c10::BFloat16* b, int64_t ldb, c10::BFloat16* c, int64_t ldc);

}  // namespace sd
