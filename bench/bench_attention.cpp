// Attention at Stable Diffusion's shapes: the plain path (baddbmm, softmax, bmm, as diffusers' AttnProcessor) against
// models/tiled_attention.h and, for heads of up to 16 channels, models/small_head_attention.h, for wider heads
// models/wide_head_attention.h; forward alone and forward + backward, with what each keeps for backward. One JSON
// line per case and path. The wide-head paths take the slices as the heads of one batch entry, in the model's
// [B, L, heads*d] layout (the products then read every head's rows at the stride of all heads, as in the model), and
// pay for the copies into it; the plain path gets them as [slices, L, d] already, without the copies into and out
// of that layout the model pays for it.
//   bench_attention [--threads N] [--dtype float32|bf16] [--cases SUBSTRING] [--path PREFIX] [--repeats N]
// Paths: plain, tiled, small_head_256, wide_head_256 and wide_recompute_256 (AVX2) and, on a CPU with AVX-512F, the
// same at 512; --path takes those that start with PREFIX (small_head, wide_head or wide_recompute: both widths).
// wide_recompute is wide_head as memory-efficient training runs it, recomputing the probabilities in backward.
// --repeats: timed runs per case, 5 by default; more for a profiler.
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/cpu_features.h"
#include "core/threads.h"
#include "models/small_head_attention.h"
#include "models/tiled_attention.h"
#include "models/wide_head_attention.h"

namespace {

struct Case {
  std::string name;
  int64_t slices, lq, lk, d;  // slices = batch x heads
};

at::Tensor plain_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  at::Tensor scores = at::baddbmm(at::empty({q.size(0), q.size(1), k.size(1)}, q.options()), q, k.transpose(1, 2),
                                  /*beta=*/0, /*alpha=*/scale);
  return at::bmm(scores.to(at::kFloat).softmax(-1).to(v.scalar_type()), v);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  at::ScalarType dtype = at::kFloat;
  std::string only_cases, only_path;  // empty: every case, every path
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--dtype")) dtype = sd::bench::dtype_from_name(argv[i + 1]);
    if (!std::strcmp(argv[i], "--cases")) only_cases = argv[i + 1];
    if (!std::strcmp(argv[i], "--path")) only_path = argv[i + 1];
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::atoi(argv[i + 1]);
  }
  sd::set_compute_threads(threads);
  const bool avx512 = sd::kernel_vector_bits() == 512;
  const std::vector<Case> cases = {
      {"sd15-256 self 32x32", 8, 1024, 1024, 40},
      {"sd15-256 cross 32x32", 8, 1024, 77, 40},
      {"sd15-256 self 16x16", 8, 256, 256, 80},
      {"sd15-512 self 64x64", 8, 4096, 4096, 40},
      {"sd2-512 self 64x64", 5, 4096, 4096, 64},
      {"sd2-512 self 32x32", 10, 1024, 1024, 64},
      {"vae-512 mid 64x64", 1, 4096, 4096, 512},  // the VAE's single head of 512 channels, decoding 512²
      {"tiny self 32x32 x2", 4, 1024, 1024, 8},
      // tiny-sd1's attentions in textual inversion at 64² (16x16 latents), batch 2 x 8 heads
      {"tiny self 16x16", 16, 256, 256, 4},
      {"tiny cross 16x16", 16, 256, 77, 4},
      {"tiny self 8x8", 16, 64, 64, 8},
      {"tiny cross 8x8", 16, 64, 77, 8},
      {"tiny self 4x4", 16, 16, 16, 8},
  };
  for (const Case& c : cases) {
    if (std::string(c.name).find(only_cases) == std::string::npos) continue;
    at::manual_seed(0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    const at::Tensor q = at::randn({c.slices, c.lq, c.d}).to(dtype), k = at::randn({c.slices, c.lk, c.d}).to(dtype),
                     v = at::randn({c.slices, c.lk, c.d}).to(dtype), d_out = at::randn({c.slices, c.lq, c.d}).to(dtype);
    const double gemm_flops = 4.0 * c.slices * c.lq * c.lk * c.d;  // q kᵀ and P v
    using Fn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double)>;
    std::vector<std::pair<std::string, Fn>> paths = {
        {"plain", plain_attention},
        {"tiled", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double s) {
           return sd::models::tiled_attention(q, k, v, s, false);
         }}};
    // A fused kernel as path name_256 (AVX2) and, on a CPU with AVX-512F, name_512.
    const auto add_at_each_width = [&](const std::string& name, const Fn& kernel) {
      for (const int bits : avx512 ? std::vector<int>{256, 512} : std::vector<int>{256})
        paths.emplace_back(name + "_" + std::to_string(bits),
                           [bits, kernel](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double s) {
                             sd::set_kernel_vector_bits(bits);
                             return kernel(q, k, v, s);
                           });
    };
    // Each slice as a batch entry of one head: the same numbers in the fused kernels' [B, L, heads*d] layout.
    if (sd::models::small_head_attention_fits(q, k, v, 1))
      add_at_each_width("small_head", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double s) {
        return sd::models::small_head_attention(q, k, v, 1, s, false);
      });
    // [slices, L, d] -> [1, L, slices*d]: the slices as heads, in the model's layout.
    const auto as_heads = [](const at::Tensor& x) { return x.transpose(0, 1).reshape({1, x.size(1), -1}); };
    const int64_t heads = c.slices;
    if (sd::models::wide_head_attention_fits(as_heads(q), as_heads(k), as_heads(v), heads)) {
      for (const bool keep : {true, false})
        add_at_each_width(
            keep ? "wide_head" : "wide_recompute",
            [&as_heads, heads, keep](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double s) {
              const at::Tensor out = sd::models::wide_head_attention(as_heads(q), as_heads(k), as_heads(v), heads, s,
                                                                     /*upcast_attention=*/false, keep);
              return out.view({q.size(1), heads, q.size(2)}).transpose(0, 1);  // [slices, L, d], a view
            });
    }
    for (const auto& [path, fn] : paths) {
      if (path.rfind(only_path, 0) != 0) continue;
      const auto forward = sd::bench::time_it(
          [&] {
            at::NoGradGuard no_grad;
            fn(q, k, v, scale);
          },
          1, repeats);
      const auto training = sd::bench::time_it(
          [&] {
            const at::Tensor qg = q.detach().requires_grad_(), kg = k.detach().requires_grad_(),
                             vg = v.detach().requires_grad_();
            torch::autograd::backward({fn(qg, kg, vg, scale)}, {d_out});
          },
          1, repeats);
      // small_head keeps each query row's maximum and sum (8 bytes per row), and up to 2^22 float32 probabilities
      // over the keys padded to whole vectors of 16; wide_recompute only the rows' maximum and sum.
      const int64_t padded_scores = c.slices * c.lq * ((c.lk + 15) / 16 * 16);
      const int64_t kept = path == "plain" || path.rfind("wide_head", 0) == 0
                               ? c.slices * c.lq * c.lk * static_cast<int64_t>(v.element_size())
                           : path.rfind("small_head", 0) == 0
                               ? c.slices * c.lq * 8 + (padded_scores <= (int64_t{1} << 22) ? 4 * padded_scores : 0)
                           : path.rfind("wide_recompute", 0) == 0 ? c.slices * c.lq * 8
                                                                  : 0;
      const nlohmann::json line = {{"case", c.name},
                                   {"path", path},
                                   {"dtype", c10::toString(dtype)},
                                   {"forward", sd::bench::timing_json(forward)},
                                   {"forward_gflops", gemm_flops / forward.median_s / 1e9},
                                   {"forward_backward", sd::bench::timing_json(training)},
                                   {"forward_backward_model_gflops", 3 * gemm_flops / training.median_s / 1e9},
                                   {"kept_for_backward_bytes_beyond_qkv", kept}};
      std::printf("%s\n", line.dump().c_str());
      std::fflush(stdout);
    }
  }
}
