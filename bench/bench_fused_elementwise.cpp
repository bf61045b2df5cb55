// The bf16 norms and SiLU at tiny-sd1's and SD-1.5's shapes, forward + backward (input and parameter gradients):
// sdtrain's kernels (models/fused_norm.h, models/fused_activations.h) against the LibTorch path they replace (the input
// and weights cast to float32, LibTorch's float32 norm, the result cast back; LibTorch's bf16 SiLU).
//   bench_fused_elementwise [--threads N]
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/threads.h"
#include "models/fused_norm.h"
#include "models/fused_activations.h"

namespace {

using Op = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias)>;

struct Case {
  std::string op;  // "group_norm" (32 groups), "layer_norm" (over the last dimension), "silu" or "geglu"
  std::vector<int64_t> shape;
};

// The two paths of one case.
std::pair<Op, Op> paths(const Case& c) {
  const auto f = at::kFloat;
  if (c.op == "group_norm")
    return {[](auto& x, auto& w, auto& b) { return sd::models::fused_group_norm(x, 32, w, b, 1e-5); },
            [f](auto& x, auto& w, auto& b) {
              return at::group_norm(x.to(f), 32, w.to(f), b.to(f), 1e-5).to(x.scalar_type());
            }};
  if (c.op == "layer_norm") {
    const int64_t n = c.shape.back();
    return {[n](auto& x, auto& w, auto& b) { return sd::models::fused_layer_norm(x, {n}, w, b, 1e-5); },
            [n, f](auto& x, auto& w, auto& b) {
              return at::layer_norm(x.to(f), {n}, w.to(f), b.to(f), 1e-5).to(x.scalar_type());
            }};
  }
  if (c.op == "geglu")
    return {[](auto& h, auto&, auto&) { return sd::models::fused_geglu(h); },
            [](auto& h, auto&, auto&) {
              const auto parts = h.chunk(2, -1);
              return parts[0] * at::gelu(parts[1].contiguous());
            }};
  return {[](auto& x, auto&, auto&) { return sd::models::fused_silu(x); },
          [](auto& x, auto&, auto&) { return at::silu(x); }};
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  at::ScalarType dtype = at::kBFloat16;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--dtype")) dtype = std::strcmp(argv[i + 1], "float32") ? at::kBFloat16 : at::kFloat;
  }
  sd::set_compute_threads(threads);
  // tiny-sd1 at 64² (8x8 and 4x4 latents, 64 tokens of 32 features), SD-1.5 at 256² (32x32 and 8x8 latents, 1024
  // tokens of 320) and at 512² (64x64).
  std::vector<Case> cases;
  for (const char* op : {"group_norm", "silu"})
    for (const auto& shape : std::vector<std::vector<int64_t>>{
             {2, 32, 8, 8}, {2, 64, 4, 4}, {1, 320, 32, 32}, {1, 1280, 8, 8}, {1, 320, 64, 64}})
      cases.push_back({op, shape});
  for (const auto& shape : std::vector<std::vector<int64_t>>{{2, 64, 32}, {1, 1024, 320}, {1, 4096, 320}})
    cases.push_back({"layer_norm", shape});
  // GEGLU's projections: tiny-sd1's 64 tokens into 2 x 128, SD-1.5's 1024 and 4096 into 2 x 1280.
  for (const auto& shape : std::vector<std::vector<int64_t>>{{2, 64, 256}, {1, 1024, 2560}, {1, 4096, 2560}})
    cases.push_back({"geglu", shape});
  for (const Case& c : cases) {
    at::manual_seed(0);
    const int64_t channels = c.op == "layer_norm" ? c.shape.back() : c.shape[1];
    std::vector<int64_t> out_shape = c.shape;
    if (c.op == "geglu") out_shape.back() /= 2;
    const at::Tensor x0 = (at::randn(c.shape) * 3 + 1).to(dtype), grad = at::randn(out_shape).to(dtype);
    const at::Tensor w0 = at::randn({channels}).to(dtype), b0 = at::randn({channels}).to(dtype);
    nlohmann::json line = {{"op", c.op}, {"shape", c.shape}, {"dtype", c10::toString(dtype)}};
    const auto [sdtrain, libtorch] = paths(c);
    for (const auto& [name, op] : {std::pair{"sdtrain", sdtrain}, std::pair{"libtorch", libtorch}}) {
      const auto timing = sd::bench::time_it(
          [&, &op = op] {
            const at::Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_(),
                             b = b0.detach().requires_grad_();
            torch::autograd::backward({op(x, w, b)}, {grad});
          },
          20, 101);
      line[name] = sd::bench::timing_json(timing);
    }
    line["speedup"] = line["libtorch"]["median_s"].get<double>() / line["sdtrain"]["median_s"].get<double>();
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
  }
}
