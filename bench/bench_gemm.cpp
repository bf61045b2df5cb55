// The GEMMs of the SD-1.5 UNet's transformer blocks at one resolution, as training runs them: forward (x W^T), input
// gradient (dY W) and weight gradient (dY^T x), each against the square GEMM that `sdtrain benchmark` takes as the
// machine's peak. Tells whether the step's linear layers lose to their shapes or to the rest of the step (caches,
// memory traffic between ops). In bf16 on a CPU that runs it in oneDNN, also forward and input gradient from the
// weight packed once (core/onednn_matmul.h's PackedMatrix, as frozen layers can). One JSON object per shape on stdout.
//   bench_gemm [--resolution 256] [--threads 2] [--dtype float32|bf16]
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "bench_util.h"
#include "core/onednn_matmul.h"
#include "core/threads.h"

namespace {

struct Shape {
  std::string layer;
  int64_t rows, in, out;  // tokens x in_features -> out_features
};

// Per attention level of SD-1.5 (channels 320, 640, 1280 at latent/1, /2, /4): q, k, v and out projections, GEGLU's
// input projection (to 2 x 4C) and the feed-forward output; and the cross-attention keys and values from CLIP's
// 77 x 768 context.
std::vector<Shape> transformer_shapes(int64_t resolution) {
  std::vector<Shape> shapes;
  const int64_t latent = resolution / 8;
  for (int level = 0; level < 3; ++level) {
    const int64_t c = 320 << level, side = latent >> level, tokens = side * side;
    const std::string at = " at " + std::to_string(side) + "x" + std::to_string(side);
    shapes.push_back({"to_q/k/v/out" + at, tokens, c, c});
    shapes.push_back({"ff.proj" + at, tokens, c, 8 * c});
    shapes.push_back({"ff.out" + at, tokens, 4 * c, c});
    shapes.push_back({"context to_k/v" + at, 77, 768, c});
  }
  // The 3x3 convolutions of 1280 channels at the two lowest levels as the GEMM convolution runs them: one row per
  // pixel, Cin·9 = 11520 inputs.
  for (const int64_t side : {latent / 4, latent / 8})
    shapes.push_back({"conv 3x3 at " + std::to_string(side) + "x" + std::to_string(side), side * side, 11520, 1280});
  return shapes;
}

double gflops(double flops, const sd::bench::Timing& t) { return flops / t.median_s / 1e9; }

}  // namespace

int main(int argc, char** argv) {
  int64_t resolution = 256;
  int threads = 2;
  std::string dtype_name = "float32";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--resolution")) resolution = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--dtype")) dtype_name = argv[i + 1];
  }
  sd::set_compute_threads(threads);
  const at::ScalarType dtype = sd::bench::dtype_from_name(dtype_name);
  const double peak = sd::perf::gemm_gflops(dtype);
  for (const Shape& s : transformer_shapes(resolution)) {
    const auto options = at::TensorOptions().dtype(dtype);
    const at::Tensor x = at::randn({s.rows, s.in}, options), w = at::randn({s.out, s.in}, options);
    const at::Tensor dy = at::randn({s.rows, s.out}, options);
    const double flops = 2.0 * static_cast<double>(s.rows * s.in * s.out);
    const auto forward = sd::bench::time_it([&] { at::mm(x, w.t()); }, 3, 9);
    const auto input_grad = sd::bench::time_it([&] { at::mm(dy, w); }, 3, 9);
    const auto weight_grad = sd::bench::time_it([&] { at::mm(dy.t(), x); }, 3, 9);
    nlohmann::json line = {{"layer", s.layer},
                           {"rows", s.rows},
                           {"in", s.in},
                           {"out", s.out},
                           {"dtype", dtype_name},
                           {"threads", threads},
                           {"square_peak_gflops", peak},
                           {"forward_gflops", gflops(flops, forward)},
                           {"input_grad_gflops", gflops(flops, input_grad)},
                           {"weight_grad_gflops", gflops(flops, weight_grad)}};
    if (sd::onednn_matmul_fits(x, w.t())) {  // a frozen layer's products from its weight packed once
      sd::PackedMatrix forward_weight, input_grad_weight;
      const auto forward_packed = sd::bench::time_it([&] { forward_weight.times(x, w.t()); }, 3, 9);
      const auto input_grad_packed = sd::bench::time_it([&] { input_grad_weight.times(dy, w); }, 3, 9);
      line["forward_packed_gflops"] = gflops(flops, forward_packed);
      line["input_grad_packed_gflops"] = gflops(flops, input_grad_packed);
    }
    std::printf("%s\n", line.dump().c_str());
  }
}
