#include "models/fused_norm.h"

#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/kernel_call.h"
#include "core/parallel.h"
#include "core/simd.h"
#include "perf/op_profiler.h"

namespace sd::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct RowMoments {
  float mean, rstd;
};

// The rows forward and backward, once per vector width (fused_norm_rows.inl, against core/simd.h's operations).
#define SD_KERNELS "models/fused_norm_rows.inl"
#include "core/simd_each_width.inl"

// How a norm sees its input: `rows` rows of n values, each row normalised on its own. Rows take their affine
// parameters in turn from `groups` sets of n / segment (row r from set r % groups), and `segment` consecutive values
// share one parameter. Group norm over [N, C, H, W]: N·G rows of C/G·H·W values, G sets of C/G, segment H·W. Layer
// norm: one set of n, segment 1.
struct Layout {
  int64_t rows, n, segment, groups;
  int64_t parameters_per_row() const { return n / segment; }
};

const RowMoments* moments_of(const at::Tensor& t) { return reinterpret_cast<const RowMoments*>(t.data_ptr<float>()); }

// A parameter tensor's values as float32 (without an op: a few hundred values, read once per call).
std::vector<float> floats_of(const at::Tensor& p) {
  const at::Tensor c = p.contiguous();
  std::vector<float> out(c.numel());
  if (c.scalar_type() == at::kBFloat16)
    std::copy_n(c.data_ptr<c10::BFloat16>(), out.size(), out.begin());
  else
    std::copy_n(c.data_ptr<float>(), out.size(), out.begin());
  return out;
}

// float32 sums into a new tensor like `like` (float32 or bf16, rounded once).
at::Tensor tensor_like(const std::vector<float>& values, const at::Tensor& like) {
  at::Tensor out = at::empty(like.sizes(), like.options());
  if (out.scalar_type() == at::kBFloat16)
    std::copy(values.begin(), values.end(), out.data_ptr<c10::BFloat16>());
  else
    std::copy(values.begin(), values.end(), out.data_ptr<float>());
  return out;
}

// Rows per parallel chunk: enough values that a chunk outweighs handing it to a thread.
int64_t row_grain(const Layout& l) { return std::max<int64_t>(1, 16384 / l.n); }

template <typename T>
void forward_rows(const Layout& l, const T* x, T* y, const float* gamma, const float* beta, float eps,
                  RowMoments* moments) {
  sd::parallel_for(0, l.rows, row_grain(l), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t row = r * l.n, set = r % l.groups * l.parameters_per_row();
      moments[r] = SD_CALL_KERNEL(row_moments, x + row, l.n, eps);
      SD_CALL_KERNEL(normalize_row, x + row, y + row, l.n, l.segment, gamma + set, beta + set, moments[r]);
    }
  });
}

// dx into `dx`; with segments, each row's Σdy and Σdy·(x − mean) per segment into segment_sums [rows, n / segment, 2].
template <typename T>
void input_gradient_rows(const Layout& l, const T* dy, const T* x, T* dx, const float* gamma, const RowMoments* moments,
                         float* segment_sums) {
  sd::parallel_for(0, l.rows, row_grain(l), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t row = r * l.n, set = r % l.groups * l.parameters_per_row();
      float* sums = segment_sums ? segment_sums + 2 * r * l.parameters_per_row() : nullptr;
      SD_CALL_KERNEL(input_gradient_row, dy + row, x + row, dx + row, l.n, l.segment, gamma + set, moments[r], sums);
    }
  });
}

// The parameters' gradients from the per-segment sums: dgamma = Σ rstd · Σdy·(x − mean), dbeta = Σ Σdy over the rows
// of each parameter's set, in row order.
void parameter_gradients_from_segments(const Layout& l, const float* segment_sums, const RowMoments* moments,
                                       std::vector<float>& dgamma, std::vector<float>& dbeta) {
  const int64_t per_row = l.parameters_per_row();
  for (int64_t p = 0; p < l.groups * per_row; ++p) {
    const int64_t set = p / per_row, s = p % per_row;
    float gamma_sum = 0, beta_sum = 0;
    for (int64_t r = set; r < l.rows; r += l.groups) {
      const float* sums = segment_sums + 2 * (r * per_row + s);
      gamma_sum += moments[r].rstd * sums[1];
      beta_sum += sums[0];
    }
    dgamma[p] = gamma_sum;
    dbeta[p] = beta_sum;
  }
}

// The per-value parameters' gradients (segment 1): each set's columns summed over its rows, columns spread over
// threads.
template <typename T>
void parameter_gradients_from_columns(const Layout& l, const T* dy, const T* x, const RowMoments* moments,
                                      std::vector<float>& dgamma, std::vector<float>& dbeta) {
  for (int64_t set = 0; set < l.groups; ++set) {
    const int64_t offset = set * l.n;
    sd::parallel_for(0, l.n, 64, [&](int64_t begin, int64_t end) {
      SD_CALL_KERNEL(parameter_gradient_columns, dy + offset, x + offset, moments + set, l.rows - set, l.n, l.groups,
                     begin, end, dgamma.data() + offset, dbeta.data() + offset);
    });
  }
}

class FusedNorm : public torch::autograd::Function<FusedNorm> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& weight,
                            const at::Tensor& bias, int64_t n, int64_t segment, int64_t groups, double eps) {
    RECORD_USER_SCOPE_WITH_INPUTS("sdtrain::norm", std::vector<c10::IValue>({x_in}));
    const at::Tensor x = x_in.contiguous();
    const Layout l{x.numel() / n, n, segment, groups};
    at::Tensor y = at::empty(x.sizes(), x.options());
    at::Tensor moments = at::empty({l.rows, 2}, x.options().dtype(at::kFloat));
    const std::vector<float> gamma = floats_of(weight), beta = floats_of(bias);
    with_kernel_values(x.scalar_type(), [&](auto type) {
      using T = decltype(type);
      forward_rows(l, kernel_values<T>(x), kernel_values<T>(y), gamma.data(), beta.data(), static_cast<float>(eps),
                   reinterpret_cast<RowMoments*>(moments.data_ptr<float>()));
    });
    ctx->save_for_backward({x, weight, bias, moments});
    ctx->saved_data["layout"] = std::vector<int64_t>{n, segment, groups};
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    RECORD_USER_SCOPE("sdtrain::norm_backward");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &bias = saved[2], &moments = saved[3];
    const std::vector<int64_t> layout = ctx->saved_data["layout"].toIntVector();
    const Layout l{x.numel() / layout[0], layout[0], layout[1], layout[2]};
    const at::Tensor dy = grads[0].to(x.scalar_type()).contiguous();
    const bool parameters = ctx->needs_input_grad(1) || ctx->needs_input_grad(2);
    at::Tensor dx = at::empty(x.sizes(), x.options());
    at::Tensor segment_sums =
        l.segment > 1 ? at::empty({l.rows, l.parameters_per_row(), 2}, moments.options()) : at::Tensor();
    const std::vector<float> gamma = floats_of(weight);
    std::vector<float> dgamma(parameters ? weight.numel() : 0), dbeta(parameters ? weight.numel() : 0);
    with_kernel_values(x.scalar_type(), [&](auto type) {
      using T = decltype(type);
      input_gradient_rows(l, kernel_values<T>(dy), kernel_values<T>(x), kernel_values<T>(dx), gamma.data(),
                          moments_of(moments), l.segment > 1 ? segment_sums.data_ptr<float>() : nullptr);
      if (parameters && l.segment > 1)
        parameter_gradients_from_segments(l, segment_sums.data_ptr<float>(), moments_of(moments), dgamma, dbeta);
      else if (parameters)
        parameter_gradients_from_columns(l, kernel_values<T>(dy), kernel_values<T>(x), moments_of(moments), dgamma,
                                         dbeta);
    });
    if (!parameters) return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    return {
        dx,          tensor_like(dgamma, weight), tensor_like(dbeta, bias), at::Tensor(), at::Tensor(), at::Tensor(),
        at::Tensor()};
  }
};

bool is_parameter(const at::Tensor& p) {
  return p.defined() && p.device().is_cpu() && (p.scalar_type() == at::kFloat || p.scalar_type() == at::kBFloat16);
}

}  // namespace

bool fused_norm_fits(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return sd::cpu_has_avx2_fma() && x.device().is_cpu() &&
         (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat) && x.numel() > 0 && is_parameter(weight) &&
         is_parameter(bias);
}

at::Tensor fused_group_norm(const at::Tensor& x, int64_t groups, const at::Tensor& weight, const at::Tensor& bias,
                            double eps) {
  SD_CHECK(fused_norm_fits(x, weight, bias),
           "fused_group_norm: expected a float32 or bf16 CPU input with float32 or bf16 weight "
           "and bias on an AVX2 CPU, got {} x, {} weight",
           c10::toString(x.scalar_type()), c10::toString(weight.scalar_type()));
  SD_CHECK(
      x.dim() >= 2 && groups > 0 && x.size(1) % groups == 0 && weight.numel() == x.size(1) && bias.numel() == x.size(1),
      "fused_group_norm: expected x [N, C, ...] with C divisible by {} groups and weight and bias of C values, "
      "got x [{}], weight [{}], bias [{}]",
      groups, fmt::join(x.sizes(), ", "), fmt::join(weight.sizes(), ", "), fmt::join(bias.sizes(), ", "));
  const int64_t pixels = x.numel() / (x.size(0) * x.size(1));
  return FusedNorm::apply(x, weight, bias, x.size(1) / groups * pixels, pixels, groups, eps);
}

at::Tensor fused_layer_norm(const at::Tensor& x, at::IntArrayRef normalized_shape, const at::Tensor& weight,
                            const at::Tensor& bias, double eps) {
  SD_CHECK(fused_norm_fits(x, weight, bias),
           "fused_layer_norm: expected a float32 or bf16 CPU input with float32 or bf16 weight "
           "and bias on an AVX2 CPU, got {} x, {} weight",
           c10::toString(x.scalar_type()), c10::toString(weight.scalar_type()));
  const auto dims = static_cast<int64_t>(normalized_shape.size());
  SD_CHECK(dims > 0 && x.dim() >= dims && x.sizes().slice(x.dim() - dims) == normalized_shape &&
               weight.sizes() == normalized_shape && bias.sizes() == normalized_shape,
           "fused_layer_norm: expected x [..., {}] and weight and bias of that shape, got x [{}], weight [{}], "
           "bias [{}]",
           fmt::join(normalized_shape, ", "), fmt::join(x.sizes(), ", "), fmt::join(weight.sizes(), ", "),
           fmt::join(bias.sizes(), ", "));
  return FusedNorm::apply(x, weight, bias, c10::multiply_integers(normalized_shape), 1, 1, eps);
}

}  // namespace sd::models
