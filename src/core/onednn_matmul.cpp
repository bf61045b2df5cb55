#include "core/onednn_matmul.h"

#include <ATen/record_function.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <map>
#include <optional>
#include <unordered_map>

#include "core/cpu_features.h"

namespace sd {

namespace {

using dnnl::memory;

// The strides {row, column} under which oneDNN reads a 2-D tensor, if it is row-major or column-major. A dimension
// of size one has no meaningful stride in LibTorch (it may hold anything), so it gets the one its layout implies.
std::optional<std::array<int64_t, 2>> matrix_strides(const at::Tensor& t) {
  const int64_t rows = t.size(0), cols = t.size(1);
  const bool unit_cols = cols == 1 || t.stride(1) == 1, unit_rows = rows == 1 || t.stride(0) == 1;
  if (unit_cols && (rows == 1 || t.stride(0) >= cols)) return std::array<int64_t, 2>{rows == 1 ? cols : t.stride(0), 1};
  if (unit_rows && (cols == 1 || t.stride(1) >= rows)) return std::array<int64_t, 2>{1, cols == 1 ? rows : t.stride(1)};
  return std::nullopt;
}

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A primitive per shape, layout and bias, for the calling thread (as is its stream): {M, N, K, a's strides,
// b's strides, bias}. A model runs a few dozen distinct shapes, so the map stays small.
using MatmulKey = std::array<int64_t, 8>;

struct Matmul {
  memory::desc a, b, bias, c;
  dnnl::matmul primitive;
};

const Matmul& matmul_for(const MatmulKey& key) {
  thread_local std::map<MatmulKey, Matmul> matmuls;
  auto it = matmuls.find(key);
  if (it != matmuls.end()) return it->second;
  const auto [m, n, k, a0, a1, b0, b1, has_bias] = key;
  const auto bf16 = memory::data_type::bf16;
  Matmul mm{memory::desc({m, k}, bf16, {a0, a1}),
            memory::desc({k, n}, bf16, {b0, b1}),
            has_bias ? memory::desc({1, n}, bf16, {n, 1}) : memory::desc(),
            memory::desc({m, n}, bf16, {n, 1}),
            {}};
  mm.primitive = dnnl::matmul({dnnl::matmul::desc(mm.a, mm.b, mm.bias, mm.c), cpu_engine()});
  return matmuls.emplace(key, std::move(mm)).first->second;
}

memory wrap(const at::Tensor& t, const memory::desc& md) { return memory(md, cpu_engine(), t.data_ptr()); }

}  // namespace

bool onednn_matmul_fits(const at::Tensor& a, const at::Tensor& b) {
  // LibTorch runs products of at most 16³ multiply-adds in its own kernel, which rounds differently: those stay
  // with at::mm, so that every product is the one at::mm computes.
  constexpr int64_t kLeastOnednnProduct = 16 * 16 * 16 + 1;
  return a.dim() == 2 && b.dim() == 2 && a.scalar_type() == at::kBFloat16 && b.scalar_type() == at::kBFloat16 &&
         a.is_cpu() && b.is_cpu() && a.size(1) == b.size(0) &&
         a.size(0) * a.size(1) * b.size(1) >= kLeastOnednnProduct && matrix_strides(a) && matrix_strides(b) &&
         cpu_runs_bf16_in_onednn();
}

at::Tensor onednn_matmul(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias) {
  // What at::mm would show the profiler (perf/op_profiler.h: the linear class and its FLOPs).
  RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::mm", std::vector<c10::IValue>({a, b}));
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  const auto as = *matrix_strides(a), bs = *matrix_strides(b);
  const at::Tensor bias_bf16 = bias.defined() ? bias.to(at::kBFloat16).contiguous() : at::Tensor();
  const Matmul& mm = matmul_for({m, n, k, as[0], as[1], bs[0], bs[1], bias.defined()});

  at::Tensor c = at::empty({m, n}, a.options());
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, wrap(a, mm.a)}, {DNNL_ARG_WEIGHTS, wrap(b, mm.b)}, {DNNL_ARG_DST, wrap(c, mm.c)}};
  if (bias.defined()) args.emplace(DNNL_ARG_BIAS, wrap(bias_bf16, mm.bias));
  thread_local dnnl::stream stream(cpu_engine());
  mm.primitive.execute(stream, args);
  return c;
}

at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  return onednn_matmul_fits(a, b) ? onednn_matmul(a, b) : at::mm(a, b);
}

}  // namespace sd
