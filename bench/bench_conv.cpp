// The UNet's convolutions at their real shapes: LibTorch's convolution (oneDNN) against models/conv2d.h's
// im2col + GEMM, forward + backward (input, weight and bias gradients), float32 or bf16. The JSON lines show where each
// is faster, which is what conv2d()'s choice (conv2d_runs_as_gemm, per dtype) rests on. The third path,
// "channels_last", is LibTorch's convolution on NHWC input, weight and gradient (as a UNet held channels-last would
// pass them): oneDNN's native layout on CPU, so no reorder around each call.
//   bench_conv [--threads N] [--dtype float32|bf16]
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/threads.h"
#include "models/conv2d.h"

namespace {

struct Case {
  int64_t batch, in, out, kernel, size;  // size x size input, stride 1, "same" padding
};

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  std::string dtype_name = "float32";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--dtype")) dtype_name = argv[i + 1];
  }
  const at::ScalarType dtype = sd::bench::dtype_from_name(dtype_name);
  sd::set_compute_threads(threads);
  // SD-1.5's levels at 256² (32, 16, 8 and 4 pixels a side) and 512² (64), its resnet (3x3) and projection or
  // shortcut (1x1) convolutions, at batch 1 and 4.
  std::vector<Case> cases;
  for (int64_t batch : {1, 4})
    for (auto [channels, size] :
         std::vector<std::pair<int64_t, int64_t>>{{320, 64}, {320, 32}, {640, 16}, {1280, 8}, {1280, 4}})
      for (int64_t kernel : {3, 1}) cases.push_back({batch, channels, channels, kernel, size});
  for (const Case& c : cases) {
    at::manual_seed(0);
    const at::Tensor x0 = at::randn({c.batch, c.in, c.size, c.size}).to(dtype);
    const at::Tensor w0 = (at::randn({c.out, c.in, c.kernel, c.kernel}) * 0.02).to(dtype);
    const at::Tensor b0 = at::randn({c.out}).to(dtype);
    const at::Tensor grad = at::randn({c.batch, c.out, c.size, c.size}).to(dtype);
    const std::vector<int64_t> stride{1, 1}, padding{c.kernel / 2, c.kernel / 2};
    nlohmann::json line = {{"dtype", dtype_name},
                           {"batch", c.batch},
                           {"in", c.in},
                           {"out", c.out},
                           {"kernel", c.kernel},
                           {"size", c.size},
                           {"conv2d_takes_gemm", sd::models::conv2d_runs_as_gemm(x0, w0, stride, padding)}};
    const double flops = 3.0 * 2 * c.batch * c.in * c.out * c.kernel * c.kernel * c.size * c.size;
    const auto nhwc = at::MemoryFormat::ChannelsLast;
    const at::Tensor x0_nhwc = x0.contiguous(nhwc), w0_nhwc = w0.contiguous(nhwc), grad_nhwc = grad.contiguous(nhwc);
    for (const char* path : {"libtorch", "gemm", "channels_last"}) {
      const bool channels_last = std::strcmp(path, "channels_last") == 0;
      const auto timing = sd::bench::time_it(
          [&] {
            const at::Tensor x = (channels_last ? x0_nhwc : x0).detach().requires_grad_(),
                             w = (channels_last ? w0_nhwc : w0).detach().requires_grad_(),
                             b = b0.detach().requires_grad_();
            const at::Tensor y = std::strcmp(path, "gemm") == 0 ? sd::models::conv2d_as_gemm(x, w, b, stride, padding)
                                                                : at::conv2d(x, w, b, stride, padding);
            torch::autograd::backward({y}, {channels_last ? grad_nhwc : grad});
          },
          2, 7);
      line[path] = sd::bench::timing_json(timing);
      line[std::string(path) + "_gflops"] = flops / timing.median_s / 1e9;
    }
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
  }
}
