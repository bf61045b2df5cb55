#include "models/fused_activations.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
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

#define SD_KERNELS "models/fused_activations_rows.inl"
#include "core/simd_each_width.inl"

// Values per parallel chunk: enough that a chunk outweighs handing it to a thread.
constexpr int64_t kGrain = 16384;
// The same in rows of n values.
int64_t row_grain(int64_t n) { return std::max<int64_t>(1, kGrain / n); }

class FusedSilu : public torch::autograd::Function<FusedSilu> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in) {
    RECORD_USER_SCOPE("sdtrain::silu");
    const at::Tensor x = x_in.contiguous();
    at::Tensor y = at::empty(x.sizes(), x.options());
    with_kernel_values(x.scalar_type(), [&](auto type) {
      using T = decltype(type);
      sd::parallel_for(0, x.numel(), kGrain, [&](int64_t begin, int64_t end) {
        SD_CALL_KERNEL(silu_values, kernel_values<T>(x) + begin, kernel_values<T>(y) + begin, end - begin);
      });
    });
    ctx->save_for_backward({x});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    RECORD_USER_SCOPE("sdtrain::silu_backward");
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor dy = grads[0].to(x.scalar_type()).contiguous();
    at::Tensor dx = at::empty(x.sizes(), x.options());
    with_kernel_values(x.scalar_type(), [&](auto type) {
      using T = decltype(type);
      sd::parallel_for(0, x.numel(), kGrain, [&](int64_t begin, int64_t end) {
        SD_CALL_KERNEL(silu_gradient_values, kernel_values<T>(dy) + begin, kernel_values<T>(x) + begin,
                       kernel_values<T>(dx) + begin, end - begin);
      });
    });
    return {dx};
  }
};

class FusedGeglu : public torch::autograd::Function<FusedGeglu> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h_in) {
    RECORD_USER_SCOPE("sdtrain::geglu");
    const at::Tensor h = h_in.contiguous();
    const int64_t n = h.size(-1) / 2;
    std::vector<int64_t> sizes = h.sizes().vec();
    sizes.back() = n;
    at::Tensor out = at::empty(sizes, h.options());
    with_kernel_values(h.scalar_type(), [&](auto type) {
      using T = decltype(type);
      sd::parallel_for(0, h.numel() / (2 * n), row_grain(n), [&](int64_t begin, int64_t end) {
        SD_CALL_KERNEL(geglu_rows, kernel_values<T>(h) + 2 * n * begin, kernel_values<T>(out) + n * begin, end - begin,
                       n);
      });
    });
    ctx->save_for_backward({h});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    RECORD_USER_SCOPE("sdtrain::geglu_backward");
    const at::Tensor h = ctx->get_saved_variables()[0];
    const at::Tensor d_out = grads[0].to(h.scalar_type()).contiguous();
    const int64_t n = h.size(-1) / 2;
    at::Tensor dh = at::empty(h.sizes(), h.options());
    with_kernel_values(h.scalar_type(), [&](auto type) {
      using T = decltype(type);
      sd::parallel_for(0, h.numel() / (2 * n), row_grain(n), [&](int64_t begin, int64_t end) {
        SD_CALL_KERNEL(geglu_gradient_rows, kernel_values<T>(d_out) + n * begin, kernel_values<T>(h) + 2 * n * begin,
                       kernel_values<T>(dh) + 2 * n * begin, end - begin, n);
      });
    });
    return {dh};
  }
};

void check_fits(const char* op, const at::Tensor& x) {
  SD_CHECK(fused_activation_fits(x), "{}: expected a float32 or bf16 CPU tensor on an AVX2 CPU, got {} on {}", op,
           c10::toString(x.scalar_type()), x.device().str());
}

}  // namespace

bool fused_activation_fits(const at::Tensor& x) {
  return sd::cpu_has_avx2_fma() && x.device().is_cpu() &&
         (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat);
}

at::Tensor fused_silu(const at::Tensor& x) {
  check_fits("fused_silu", x);
  return FusedSilu::apply(x);
}

at::Tensor fused_geglu(const at::Tensor& h) {
  check_fits("fused_geglu", h);
  SD_CHECK(h.dim() >= 1 && h.size(-1) % 2 == 0 && h.size(-1) > 0,
           "fused_geglu: expected a projection [..., 2n] with an even, non-zero last dimension, got [{}]",
           fmt::join(h.sizes(), ", "));
  return FusedGeglu::apply(h);
}

}  // namespace sd::models
