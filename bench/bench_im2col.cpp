// The patch unfolding under the GEMM convolutions (models/im2col.h) and its adjoint, alone, at the maps that take the
// GEMM path: tiny-sd1's 16x16, 8x8 and 4x4 levels (batch 2, textual inversion's step) and SD-1.5's 8x8 and 4x4
// levels at 256² (batch 1), 3x3 kernels, stride 1 and the downsamplers' stride 2. One JSON line per case: median
// microseconds of unfold_patches and fold_patches and the columns' bytes per second.
//   bench_im2col [--threads N] [--dtype float32|bf16]
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "bench_util.h"
#include "core/threads.h"
#include "models/im2col.h"

namespace {

struct Case {
  int64_t batch, channels, size, stride;
};

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  std::string dtype_name = "bf16";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--dtype")) dtype_name = argv[i + 1];
  }
  const at::ScalarType dtype = sd::bench::dtype_from_name(dtype_name);
  sd::set_compute_threads(threads);
  const Case cases[] = {{2, 32, 16, 1}, {2, 64, 16, 1},  {2, 64, 8, 1},   {2, 64, 4, 1},   {2, 32, 16, 2},
                        {2, 64, 8, 2},  {1, 1280, 8, 1}, {1, 2560, 8, 1}, {1, 1280, 4, 1}, {1, 640, 8, 2}};
  at::NoGradGuard no_grad;
  for (const Case& c : cases) {
    const at::Tensor x = at::randn({c.batch, c.channels, c.size, c.size}).to(dtype);
    const auto unfold = [&] { return sd::models::unfold_patches(x, {3, 3}, {1, 1}, {c.stride, c.stride}); };
    const at::Tensor columns = unfold();
    const auto fold = [&] {
      return sd::models::fold_patches(columns, {c.size, c.size}, {3, 3}, {1, 1}, {c.stride, c.stride});
    };
    const auto unfold_time = sd::bench::time_it([&] { unfold(); }, 50, 200);
    const auto fold_time = sd::bench::time_it([&] { fold(); }, 50, 200);
    const double bytes = static_cast<double>(columns.nbytes());
    nlohmann::json line = {{"bench", "im2col"},
                           {"dtype", dtype_name},
                           {"threads", threads},
                           {"map", {c.batch, c.channels, c.size, c.size}},
                           {"stride", c.stride},
                           {"columns_bytes", columns.nbytes()},
                           {"unfold_us", unfold_time.median_s * 1e6},
                           {"fold_us", fold_time.median_s * 1e6},
                           {"unfold_gb_per_s", bytes / unfold_time.median_s / 1e9},
                           {"fold_gb_per_s", bytes / fold_time.median_s / 1e9}};
    std::printf("%s\n", line.dump().c_str());
  }
}
