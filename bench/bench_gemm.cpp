// The GEMMs of the SD-1.5 (or tiny-sd1) UNet's transformer blocks at one resolution, as training runs them: forward
// (x W^T), input gradient (dY W) and weight gradient (dY^T x), each against the square GEMM that `sdtrain benchmark`
// takes as the machine's peak; and SD-1.5's 1280-channel 3x3 convolutions of the two lowest levels as
// models/conv2d.cpp's GEMM runs them (forward W·columns + bias, input gradient Wᵀ·dY, weight gradient dY·columnsᵀ).
// Tells whether the step's products lose to their shapes or to the rest of the step. In bf16 on a CPU that runs it in
// oneDNN, also the frozen layers' products (core/onednn_matmul.h: the weight packed once, a kept primitive). For a
// linear layer also its forward as the model runs it (models/linear.h, which may take another form of the product:
// layer_forward_gflops). One JSON object per shape.
//
// --cold evicts the caches before every timed product (by writing a buffer of 4x the last-level cache), as in a
// training step, where each weight is read once per pass and the model's weights are far larger than the cache;
// without it the weights stay cached from one repeat to the next.
//   bench_gemm [--model sd15|tiny] [--resolution 256] [--threads 2] [--dtype float32|bf16] [--cold]
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>

#include "bench_util.h"
#include "core/onednn_matmul.h"
#include "core/threads.h"
#include "models/linear.h"

namespace {

struct Shape {
  std::string layer;
  int64_t rows, in, out;  // tokens x in_features -> out_features (a convolution: pixels x Cin·9 -> Cout)
  bool conv = false;
};

// Per attention level (SD-1.5: 320, 640 and 1280 channels at latent/1, /2, /4; tiny-sd1: 32 and 64 at latent/1
// and /2, its VAE halving twice where SD's halves three times): q, k, v and out projections, GEGLU's input projection
// (to 2 x 4C) and the feed-forward output; and the cross-attention keys and values from CLIP's 77 tokens.
std::vector<Shape> transformer_shapes(const std::string& model, int64_t resolution) {
  const bool tiny = model == "tiny";
  const int64_t latent = resolution / (tiny ? 4 : 8), context = tiny ? 32 : 768;
  const std::vector<int64_t> channels = tiny ? std::vector<int64_t>{32, 64} : std::vector<int64_t>{320, 640, 1280};
  std::vector<Shape> shapes;
  for (size_t level = 0; level < channels.size(); ++level) {
    const int64_t c = channels[level], side = latent >> level, tokens = side * side;
    const std::string at = " at " + std::to_string(side) + "x" + std::to_string(side);
    shapes.push_back({"to_q/k/v/out" + at, tokens, c, c});
    shapes.push_back({"ff.proj" + at, tokens, c, 8 * c});
    shapes.push_back({"ff.out" + at, tokens, 4 * c, c});
    shapes.push_back({"context to_k/v" + at, 77, context, c});
  }
  if (tiny) return shapes;
  // The 3x3 convolutions of 1280 channels at the two lowest levels: Cin·9 = 11520 inputs per pixel.
  for (const int64_t side : {latent / 4, latent / 8})
    shapes.push_back(
        {"conv 3x3 at " + std::to_string(side) + "x" + std::to_string(side), side * side, 11520, 1280, true});
  return shapes;
}

// The products of one shape: as autograd runs them in training, and as a frozen layer runs them (bf16 in oneDNN).
struct Products {
  std::function<void()> forward, input_grad, weight_grad, frozen_forward, frozen_input_grad, layer_forward,
      transposed_input_grad;
};

Products linear_products(const Shape& s, const at::TensorOptions& options) {
  const at::Tensor x = at::randn({s.rows, s.in}, options), w = at::randn({s.out, s.in}, options);
  const at::Tensor dy = at::randn({s.rows, s.out}, options);
  Products p;
  p.forward = [=] { at::mm(x, w.t()); };
  p.input_grad = [=] { at::mm(dy, w); };
  p.weight_grad = [=] { at::mm(dy.t(), x); };
  p.layer_forward = [=] { sd::models::linear(x.view({1, s.rows, s.in}), w, {}); };  // one sample's tokens
  if (sd::onednn_matmul_fits(x, w.t())) {  // from the weight packed once, per orientation
    auto forward_weight = std::make_shared<sd::PackedMatrix>(),
         input_grad_weight = std::make_shared<sd::PackedMatrix>();
    p.frozen_forward = [=] { forward_weight->times(x, w.t()); };
    p.frozen_input_grad = [=] { input_grad_weight->times(dy, w); };
  }
  return p;
}

Products conv_products(const Shape& s, const at::TensorOptions& options) {
  const at::Tensor columns = at::randn({s.in, s.rows}, options), w = at::randn({s.out, s.in}, options);
  const at::Tensor bias = at::randn({s.out}, options), dy = at::randn({s.out, s.rows}, options);
  Products p;
  p.forward = [=] { at::addmm(bias.unsqueeze(1), w, columns); };
  p.input_grad = [=] { at::mm(w.t(), dy); };
  p.transposed_input_grad = [=] { sd::mm(dy.t(), w); };  // (dYᵀ·w)ᵀ, as models/conv2d.cpp takes float32's on small maps
  p.weight_grad = [=] { at::mm(dy, columns.t()); };
  if (sd::onednn_matmul_fits(w, columns)) {  // a kept primitive forward; the input gradient as FrozenWeight takes it
    auto packed = std::make_shared<sd::PackedMatrix>();
    p.frozen_forward = [=] { sd::onednn_addmm(bias, w, columns); };
    p.frozen_input_grad = [=] { packed->times(dy.t(), w); };
  }
  return p;
}

// A buffer of 4x the last-level cache (64 MiB if the system does not say), written in full to evict the caches.
at::Tensor cache_evicting_buffer() {
  const long last_level = std::max({sysconf(_SC_LEVEL3_CACHE_SIZE), sysconf(_SC_LEVEL2_CACHE_SIZE), 0L});
  return at::zeros({last_level > 0 ? 4 * last_level : int64_t{64} << 20}, at::kByte);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t resolution = 256;
  int threads = 2;
  bool cold = false;
  std::string dtype_name = "float32", model = "sd15";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--cold")) cold = true;
    if (i + 1 == argc) break;
    if (!std::strcmp(argv[i], "--resolution")) resolution = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--dtype")) dtype_name = argv[i + 1];
    if (!std::strcmp(argv[i], "--model")) model = argv[i + 1];
  }
  sd::set_compute_threads(threads);
  const at::ScalarType dtype = sd::bench::dtype_from_name(dtype_name);
  const double peak = sd::perf::gemm_gflops(dtype);
  at::Tensor evict = cold ? cache_evicting_buffer() : at::Tensor();
  const std::function<void()> before_each = cold ? std::function<void()>([&] { evict.add_(1); }) : nullptr;
  auto gflops_of = [&](const std::function<void()>& product, double flops) {
    return flops / sd::bench::time_it(product, 3, 9, before_each).median_s / 1e9;
  };
  for (const Shape& s : transformer_shapes(model, resolution)) {
    const auto options = at::TensorOptions().dtype(dtype);
    const Products p = s.conv ? conv_products(s, options) : linear_products(s, options);
    const double flops = 2.0 * static_cast<double>(s.rows * s.in * s.out);
    nlohmann::json line = {{"model", model},
                           {"layer", s.layer},
                           {"rows", s.rows},
                           {"in", s.in},
                           {"out", s.out},
                           {"dtype", dtype_name},
                           {"threads", threads},
                           {"cold", cold},
                           {"square_peak_gflops", peak},
                           {"forward_gflops", gflops_of(p.forward, flops)},
                           {"input_grad_gflops", gflops_of(p.input_grad, flops)},
                           {"weight_grad_gflops", gflops_of(p.weight_grad, flops)}};
    if (p.layer_forward) line["layer_forward_gflops"] = gflops_of(p.layer_forward, flops);
    if (p.transposed_input_grad) line["transposed_input_grad_gflops"] = gflops_of(p.transposed_input_grad, flops);
    if (p.frozen_forward) {
      line["frozen_forward_gflops"] = gflops_of(p.frozen_forward, flops);
      line["frozen_input_grad_gflops"] = gflops_of(p.frozen_input_grad, flops);
    }
    std::printf("%s\n", line.dump().c_str());
  }
}
