#include "models/bf16_silu.h"

#include <torch/csrc/autograd/custom_function.h>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/simd.h"
#include "perf/op_profiler.h"

namespace sd::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

#define SD_KERNELS "models/bf16_silu_rows.inl"
#include "core/simd_each_width.inl"

const uint16_t* bits(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<c10::BFloat16>()); }
uint16_t* bits(at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<c10::BFloat16>()); }

// Values per parallel chunk: enough that a chunk outweighs handing it to a thread.
constexpr int64_t kGrain = 16384;

class Bf16Silu : public torch::autograd::Function<Bf16Silu> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in) {
    RECORD_USER_SCOPE("sdtrain::silu");
    const at::Tensor x = x_in.contiguous();
    at::Tensor y = at::empty(x.sizes(), x.options());
    sd::parallel_for(0, x.numel(), kGrain, [&](int64_t begin, int64_t end) {
      if (sd::kernel_vector_bits() == 512)
        avx512::silu_values(bits(x) + begin, bits(y) + begin, end - begin);
      else
        avx2::silu_values(bits(x) + begin, bits(y) + begin, end - begin);
    });
    ctx->save_for_backward({x});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    RECORD_USER_SCOPE("sdtrain::silu_backward");
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor dy = grads[0].to(at::kBFloat16).contiguous();
    at::Tensor dx = at::empty(x.sizes(), x.options());
    sd::parallel_for(0, x.numel(), kGrain, [&](int64_t begin, int64_t end) {
      if (sd::kernel_vector_bits() == 512)
        avx512::silu_gradient_values(bits(dy) + begin, bits(x) + begin, bits(dx) + begin, end - begin);
      else
        avx2::silu_gradient_values(bits(dy) + begin, bits(x) + begin, bits(dx) + begin, end - begin);
    });
    return {dx};
  }
};

}  // namespace

bool bf16_silu_fits(const at::Tensor& x) {
  return sd::cpu_has_avx2_fma() && x.device().is_cpu() && x.scalar_type() == at::kBFloat16;
}

at::Tensor bf16_silu(const at::Tensor& x) {
  SD_CHECK(bf16_silu_fits(x), "bf16_silu: expected a bf16 CPU tensor on an AVX2 CPU, got {} on {}",
           c10::toString(x.scalar_type()), x.device().str());
  return Bf16Silu::apply(x);
}

}  // namespace sd::models
