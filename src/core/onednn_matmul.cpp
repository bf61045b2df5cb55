#include "core/onednn_matmul.h"

#include <ATen/record_function.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>

#include "core/cpu_features.h"
#include "core/onednn_sgemm.h"
#include "core/error.h"
#include "core/parallel.h"

namespace sd {

namespace {

using dnnl::memory;

// A 2-D tensor as a product reads it: the tensor itself or its transpose, whose sizes and strides are swapped here
// rather than in a view (a linear layer's weight.t() costs three dispatched ops per call).
struct Operand {
  const at::Tensor& tensor;
  bool is_transposed;
  int64_t rows, cols, row_stride, col_stride;
};

Operand as_is(const at::Tensor& t) { return {t, false, t.size(0), t.size(1), t.stride(0), t.stride(1)}; }
Operand transposed(const at::Tensor& t) { return {t, true, t.size(1), t.size(0), t.stride(1), t.stride(0)}; }

// The strides {row, column} under which oneDNN reads an operand, if it is row-major or column-major. A dimension
// of size one has no meaningful stride in LibTorch (it may hold anything), so it gets the one its layout implies.
std::optional<std::array<int64_t, 2>> matrix_strides(const Operand& t) {
  const int64_t rows = t.rows, cols = t.cols;
  const bool unit_cols = cols == 1 || t.col_stride == 1, unit_rows = rows == 1 || t.row_stride == 1;
  if (unit_cols && (rows == 1 || t.row_stride >= cols))
    return std::array<int64_t, 2>{rows == 1 ? cols : t.row_stride, 1};
  if (unit_rows && (cols == 1 || t.col_stride >= rows))
    return std::array<int64_t, 2>{1, cols == 1 ? rows : t.col_stride};
  return std::nullopt;
}

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& cpu_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

// A primitive per product for the calling thread (as is its stream): the shape, both operands' strides, the output's
// row stride and type, the bias, the scale and whether the product adds to the output. A model runs a few dozen
// distinct products, so the map stays small.
// With packed_b, b's strides are left to oneDNN (b0 = b1 = 0): the primitive reads b in the blocked layout it picks.
struct MatmulKey {
  int64_t m, n, k, a0, a1, b0, b1, ldc;
  bool bias, float_output, accumulate;
  float alpha;
  bool packed_b = false;

  bool operator<(const MatmulKey& o) const {
    return std::tie(m, n, k, a0, a1, b0, b1, ldc, bias, float_output, accumulate, alpha, packed_b) <
           std::tie(o.m, o.n, o.k, o.a0, o.a1, o.b0, o.b1, o.ldc, o.bias, o.float_output, o.accumulate, o.alpha,
                    o.packed_b);
  }
};

struct Matmul {
  memory::desc a, b, bias, c, scratchpad;
  dnnl::matmul primitive;
  bool one_thread;  // run on the calling thread alone (kMostOneThreadProduct)
};

// Products of at most 2^21 multiply-adds and no dimension under 16, a few µs of arithmetic (most of tiny-sd1's), run
// on the calling thread alone: handing half of one to a second thread costs more than the half. bench_gemm --model
// tiny, 2 threads: the kept primitives of [256, 32] x [32, 32] 72-76 -> 188-192 GFLOP/s, [77, 32] x [32, 32] 18-24
// -> 81-85; from 2^22 (e.g. [1024, 64] x [64, 64], 17 µs against 21) two threads are ahead (docs/benchmarks.md,
// fortieth sitting). Thinner products keep every thread: SD-1.5's time embedding projections, [1, 1280] x [1280,
// 1280] and their weight gradients, stream megabytes of weights rather than compute, and its training step read no
// faster with them on one thread. oneDNN fixes a primitive's thread count when it builds it, so it is built in the
// same scope.
constexpr int64_t kMostOneThreadProduct = int64_t{1} << 21, kLeastOneThreadDimension = 16;

bool runs_on_one_thread(const MatmulKey& key) {
  return key.m * key.n * key.k <= kMostOneThreadProduct && std::min({key.m, key.n, key.k}) >= kLeastOneThreadDimension;
}

const Matmul& matmul_for(const MatmulKey& key) {
  thread_local std::map<MatmulKey, Matmul> matmuls;
  auto it = matmuls.find(key);
  if (it != matmuls.end()) return it->second;
  const bool one_thread = runs_on_one_thread(key);
  std::optional<OneThreadScope> one_thread_scope;
  if (one_thread) one_thread_scope.emplace();
  const auto bf16 = memory::data_type::bf16;
  Matmul mm{memory::desc({key.m, key.k}, bf16, {key.a0, key.a1}),
            key.packed_b ? memory::desc({key.k, key.n}, bf16, memory::format_tag::any)
                         : memory::desc({key.k, key.n}, bf16, {key.b0, key.b1}),
            key.bias ? memory::desc({1, key.n}, bf16, {key.n, 1}) : memory::desc(),
            memory::desc({key.m, key.n}, key.float_output ? memory::data_type::f32 : bf16, {key.ldc, 1}),
            {},
            {},
            one_thread};
  dnnl::primitive_attr attr;  // (the scratchpad: see scratchpad_for)
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (key.alpha != 1.f) attr.set_output_scales(0, {key.alpha});  // unset, the product is at::mm's to the bit
  if (key.accumulate) {
    dnnl::post_ops sum;
    sum.append_sum(1.f);
    attr.set_post_ops(sum);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(mm.a, mm.b, mm.bias, mm.c), attr, cpu_engine());
  mm.b = pd.weights_desc();  // the plain layout given, or the blocked one oneDNN picked for a packed b
  mm.scratchpad = pd.scratchpad_desc();
  mm.primitive = dnnl::matmul(pd);
  return matmuls.emplace(key, std::move(mm)).first->second;
}

// Where a product's oneDNN scratchpad goes (oneDNN reorders b into it for its kernels: a few KB for most products,
// 30-60 MB for SD-1.5's 3x3 convolutions of 1280 channels). Left to oneDNN, each kept primitive holds its own for the
// run, ~180 MB over an SD-1.5 training step's shapes; here the large ones come from the allocator on each call, as
// at::mm's do, and the small ones share a buffer kept per thread, since an allocation per call would add to the
// per-op cost that dominates tiny models' thousands of products. `large` holds a large one until the product is done.
void* scratchpad_for(size_t bytes, at::Tensor& large) {
  constexpr int64_t kKeptScratchpadBytes = int64_t{1} << 20;
  if (bytes > static_cast<size_t>(kKeptScratchpadBytes)) {
    large = at::empty({static_cast<int64_t>(bytes)}, at::kByte);
    return large.data_ptr();
  }
  thread_local const at::Tensor kept = at::empty({kKeptScratchpadBytes}, at::kByte);
  return kept.data_ptr();
}

void run(const Matmul& mm, const void* a, const void* b, const void* bias, void* c) {
  std::optional<OneThreadScope> one_thread_scope;
  if (mm.one_thread) one_thread_scope.emplace();
  const auto wrap = [](const memory::desc& md, const void* data) {
    return memory(md, cpu_engine(), const_cast<void*>(data));  // oneDNN's memory takes a mutable pointer
  };
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, wrap(mm.a, a)}, {DNNL_ARG_WEIGHTS, wrap(mm.b, b)}, {DNNL_ARG_DST, wrap(mm.c, c)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, wrap(mm.bias, bias));
  at::Tensor large_scratchpad;
  if (const size_t bytes = mm.scratchpad.get_size())
    args.emplace(DNNL_ARG_SCRATCHPAD, wrap(mm.scratchpad, scratchpad_for(bytes, large_scratchpad)));
  mm.primitive.execute(cpu_stream(), args);
}

// The {row, column} strides of op(X) for a row-major X with leading dimension ld.
std::array<int64_t, 2> op_strides(char trans, int64_t ld) {
  return trans == 'N' ? std::array<int64_t, 2>{ld, 1} : std::array<int64_t, 2>{1, ld};
}

void gemm_bf16_into(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k, float alpha, const c10::BFloat16* a,
                    int64_t lda, const c10::BFloat16* b, int64_t ldb, bool accumulate, void* c, int64_t ldc,
                    bool float_output) {
  const auto as = op_strides(trans_a, lda), bs = op_strides(trans_b, ldb);
  run(matmul_for({m, n, k, as[0], as[1], bs[0], bs[1], ldc, false, float_output, accumulate, alpha}), a, b, nullptr, c);
}

bool bf16_cpu_matrix(const at::Tensor& t) { return t.dim() == 2 && t.scalar_type() == at::kBFloat16 && t.is_cpu(); }

bool product_fits(const Operand& a, const Operand& b) {
  // LibTorch runs products of at most 16³ multiply-adds in its own kernel, which rounds differently: those stay
  // with at::mm, so that every product is the one at::mm computes.
  constexpr int64_t kLeastOnednnProduct = 16 * 16 * 16 + 1;
  return a.cols == b.rows && a.rows * a.cols * b.cols >= kLeastOnednnProduct && matrix_strides(a) &&
         matrix_strides(b) && cpu_runs_bf16_in_onednn();
}

at::Tensor as_bf16(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 && t.is_contiguous() ? t : t.to(at::kBFloat16).contiguous();
}

// Where a product's bias goes: [N] along every row (oneDNN's own bias), or [M] down every column, the output then
// starting as the bias with the product summed onto it, as LibTorch's addmm does (oneDNN adds a bias per row only
// in its reference kernel, 1000x slower).
enum class Bias { kAlongRows, kDownColumns };

// a·b (+ bias_bf16, as `where` says) written to the row-major [a.rows, b.cols] at c, b read from b_data (a sample
// of b.tensor, or all of it).
void multiply_into(const Operand& a, const Operand& b, const void* b_data, const at::Tensor& bias_bf16, Bias where,
                   c10::BFloat16* c) {
  const int64_t m = a.rows, k = a.cols, n = b.cols;
  const auto as = *matrix_strides(a), bs = *matrix_strides(b);
  const bool along_rows = bias_bf16.defined() && where == Bias::kAlongRows;
  const bool onto_bias = bias_bf16.defined() && where == Bias::kDownColumns;
  if (onto_bias) {  // filled here, not by a broadcast copy: four dispatched ops per product for tiny models
    const c10::BFloat16* values = bias_bf16.data_ptr<c10::BFloat16>();
    for (int64_t row = 0; row < m; ++row) std::fill_n(c + row * n, n, values[row]);
  }
  run(matmul_for({m, n, k, as[0], as[1], bs[0], bs[1], n, along_rows, false, onto_bias, 1.f}), a.tensor.data_ptr(),
      b_data, along_rows ? bias_bf16.data_ptr() : nullptr, c);
}

at::Tensor product(const Operand& a, const Operand& b, const at::Tensor& bias, Bias where = Bias::kAlongRows) {
  // What at::mm would show the profiler (perf/op_profiler.h: the linear class and its FLOPs), with b as given and
  // whether that is its transpose.
  RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::mm", std::vector<c10::IValue>({a.tensor, b.tensor, b.is_transposed}));
  at::Tensor c = at::empty({a.rows, b.cols}, a.tensor.options());
  multiply_into(a, b, b.tensor.data_ptr(), bias.defined() ? as_bf16(bias) : bias, where, c.data_ptr<c10::BFloat16>());
  return c;
}

// A sample of t [S, R, C] as a product reads it, or t itself when it is a matrix.
Operand matrix_of(const at::Tensor& t) {
  return t.dim() == 3 ? Operand{t, false, t.size(1), t.size(2), t.stride(1), t.stride(2)} : as_is(t);
}

}  // namespace

bool onednn_matmul_fits(const at::Tensor& a, const at::Tensor& b) {
  return bf16_cpu_matrix(a) && bf16_cpu_matrix(b) && product_fits(as_is(a), as_is(b));
}

at::Tensor onednn_matmul(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias) {
  return product(as_is(a), as_is(b), bias);
}

at::Tensor onednn_addmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b) {
  SD_CHECK(bias.dim() == 1 && bias.size(0) == a.size(0), "onednn_addmm: expected a bias of {} values, got [{}]",
           a.size(0), fmt::join(bias.sizes(), ", "));
  return product(as_is(a), as_is(b), bias, Bias::kDownColumns);
}

bool onednn_per_sample_fits(const at::Tensor& a, const at::Tensor& b) {
  const auto bf16_cpu = [](const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 && t.is_cpu(); };
  return bf16_cpu(a) && bf16_cpu(b) && std::min(a.dim(), b.dim()) == 2 && a.dim() + b.dim() == 5 && b.size(-1) > 1 &&
         product_fits(matrix_of(a), matrix_of(b));
}

at::Tensor onednn_addmm_per_sample(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b) {
  SD_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == a.size(0)),
           "onednn_addmm_per_sample: expected a bias of {} values, got [{}]", a.size(0), fmt::join(bias.sizes(), ", "));
  // One scope for the batch (perf/op_profiler.cpp counts b [S, K, N] as S·N columns).
  RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::mm", std::vector<c10::IValue>({a, b, false}));
  const int64_t samples = b.size(0), m = a.size(0), n = b.size(2);
  at::Tensor c = at::empty({samples, m, n}, a.options());
  const at::Tensor bias_bf16 = bias.defined() ? as_bf16(bias) : bias;
  const Operand w = as_is(a), x = matrix_of(b);
  for (int64_t s = 0; s < samples; ++s)
    multiply_into(w, x, b.data_ptr<c10::BFloat16>() + s * b.stride(0), bias_bf16, Bias::kDownColumns,
                  c.data_ptr<c10::BFloat16>() + s * m * n);
  return c;
}

bool onednn_linear_fits(const at::Tensor& x, const at::Tensor& weight) {
  return bf16_cpu_matrix(x) && bf16_cpu_matrix(weight) && product_fits(as_is(x), transposed(weight));
}

at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return product(as_is(x), transposed(weight), bias);
}

struct PackedMatrix::Packing {
  memory::desc layout;
  at::Tensor bytes;
  c10::Storage source;  // held, so that another matrix cannot reuse its address and pass for it
  int64_t source_offset, source_version;
  std::array<int64_t, 2> source_strides;

  bool holds(const at::Tensor& b, const std::array<int64_t, 2>& strides, const memory::desc& wanted) const {
    return b.storage().is_alias_of(source) && b.storage_offset() == source_offset && b._version() == source_version &&
           strides == source_strides && layout == wanted;
  }
};

PackedMatrix::PackedMatrix() = default;
PackedMatrix::~PackedMatrix() = default;

at::Tensor PackedMatrix::times(const at::Tensor& a, const at::Tensor& b) {
  RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::mm", std::vector<c10::IValue>({a, b, false}));
  const bool per_sample = a.dim() == 3;
  const int64_t samples = per_sample ? a.size(0) : 1, m = a.size(-2), k = a.size(-1), n = b.size(1);
  const auto as = *matrix_strides(matrix_of(a)), bs = *matrix_strides(as_is(b));
  const Matmul& mm = matmul_for({m, n, k, as[0], as[1], 0, 0, n, false, false, false, 1.f, /*packed_b=*/true});
  if (!packing_ || !packing_->holds(b, bs, mm.b)) {
    at::NoGradGuard no_grad;
    auto packing = std::make_unique<Packing>(
        Packing{mm.b, at::empty({static_cast<int64_t>(mm.b.get_size())}, b.options().dtype(at::kByte)), b.storage(),
                b.storage_offset(), b._version(), bs});
    memory plain(memory::desc({k, n}, memory::data_type::bf16, {bs[0], bs[1]}), cpu_engine(), b.data_ptr());
    memory packed(packing->layout, cpu_engine(), packing->bytes.data_ptr());
    dnnl::reorder(plain, packed).execute(cpu_stream(), plain, packed);
    packing_ = std::move(packing);
  }
  at::Tensor c = per_sample ? at::empty({samples, m, n}, a.options()) : at::empty({m, n}, a.options());
  for (int64_t s = 0; s < samples; ++s)
    run(mm, a.data_ptr<c10::BFloat16>() + s * (per_sample ? a.stride(0) : 0), packing_->bytes.data_ptr(), nullptr,
        c.data_ptr<c10::BFloat16>() + s * m * n);
  return c;
}

int64_t PackedMatrix::bytes() const { return packing_ ? static_cast<int64_t>(packing_->bytes.nbytes()) : 0; }

at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  if (onednn_matmul_fits(a, b)) return onednn_matmul(a, b);
  return float32_matmul_fits(a, b) ? float32_matmul(a, b) : at::mm(a, b);
}

void gemm_bf16(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k, float alpha, const c10::BFloat16* a,
               int64_t lda, const c10::BFloat16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  SD_CHECK(beta == 0.f || beta == 1.f, "gemm_bf16: beta must be 0 or 1, got {}", beta);
  gemm_bf16_into(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta == 1.f, c, ldc, true);
}

void gemm_bf16(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k, float alpha, const c10::BFloat16* a,
               int64_t lda, const c10::BFloat16* b, int64_t ldb, c10::BFloat16* c, int64_t ldc) {
  gemm_bf16_into(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, false, c, ldc, false);
}

}  // namespace sd
