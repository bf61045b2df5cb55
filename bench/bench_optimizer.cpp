// The optimizer step over N float32 parameters: LibTorch's torch::optim::AdamW (op by op) against sdtrain's fused
// AdamW pass, and the EMA as a pass of its own after it against moved in AdamW's pass. Memory traffic decides these;
// the JSON gives seconds and GB/s of the minimal traffic (AdamW: read g, p, m, v and write p, m, v = 28 bytes per
// parameter; with the EMA in its pass 36, as a pass of its own 28 + 12).
// The bf16 training step's two forms: float32 gradients, then a separate refresh of the bf16 compute weights
// (28 + 6 bytes), against bf16 gradients read and the bf16 weights written in the same pass (2 + 12 + 12 + 2 = 28).
// The gradient norm (clip_grad_norm_'s pass, 4 bytes) over parameter-sized pieces of 2M values: one piece after
// another, against the threads each taking whole pieces; and over bf16 pieces (2 bytes), as a bf16 step reads them,
// at the widest vectors and at AVX2's (the same numbers where AVX2 is the widest).
//   bench_optimizer [millions of parameters, default 100] [threads, default 2]
#include <torch/optim/adamw.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "core/cpu_features.h"
#include "core/parallel.h"
#include "core/threads.h"
#include "train/adamw.h"
#include "train/gradient_norm.h"

int main(int argc, char** argv) {
  sd::set_compute_threads(argc > 2 ? std::atoi(argv[2]) : 2);
  const int64_t n = (argc > 1 ? std::atoll(argv[1]) : 100) * 1000000;
  at::Tensor p = at::randn({n}), g = at::randn({n}) * 1e-3;

  at::Tensor torch_p = p.clone().requires_grad_(true);
  torch_p.mutable_grad() = g.clone();
  torch::optim::AdamW torch_adamw({torch_p}, torch::optim::AdamWOptions(1e-4).weight_decay(1e-2));
  const auto libtorch = sd::bench::time_it([&] { torch_adamw.step(); }, 1, 5);

  sd::train::AdamW fused(sd::train::AdamWOptions{});
  at::Tensor fused_p = p.clone();
  const auto ours = sd::bench::time_it([&] { fused.step({fused_p}, {g}, 1e-4); }, 1, 5);

  at::Tensor compute = p.to(at::kBFloat16), g_bf16 = g.to(at::kBFloat16);
  sd::train::AdamW then_refresh(sd::train::AdamWOptions{}), in_one_pass(sd::train::AdamWOptions{});
  const auto bf16_then_refresh = sd::bench::time_it(
      [&] {
        then_refresh.step({fused_p}, {g}, 1e-4);
        compute.copy_(fused_p);
      },
      1, 5);
  sd::train::AdamWFollowers bf16_copy;
  bf16_copy.rounded_copies = {compute};
  const auto bf16_one_pass =
      sd::bench::time_it([&] { in_one_pass.step({fused_p}, {g_bf16}, 1e-4, 1.0, bf16_copy); }, 1, 5);

  // The EMA as a pass of its own after AdamW (read p and the shadow, write the shadow), against moved in AdamW's.
  at::Tensor shadow = p.clone();
  sd::train::AdamW then_ema(sd::train::AdamWOptions{}), with_ema(sd::train::AdamWOptions{});
  const auto adamw_then_ema = sd::bench::time_it(
      [&] {
        then_ema.step({fused_p}, {g}, 1e-4);
        float* s = shadow.data_ptr<float>();
        const float* q = fused_p.data_ptr<float>();
        sd::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
          for (int64_t k = begin; k < end; ++k) s[k] -= (s[k] - q[k]) * 1e-4f;
        });
      },
      1, 5);
  sd::train::AdamWFollowers ema_follower;
  ema_follower.ema_shadows = {shadow};
  ema_follower.ema_one_minus_decay = 1e-4f;
  const auto adamw_with_ema = sd::bench::time_it([&] { with_ema.step({fused_p}, {g}, 1e-4, 1.0, ema_follower); }, 1, 5);

  const std::vector<at::Tensor> pieces = g.split(int64_t{1} << 21);
  double norm_in_turn = 0, norm_shared = 0;
  const auto pieces_in_turn = sd::bench::time_it(
      [&] {
        norm_in_turn = 0;
        for (const auto& piece : pieces) norm_in_turn += sd::train::squared_l2_norm(piece);
      },
      1, 5);
  const auto pieces_shared =
      sd::bench::time_it([&] { norm_shared = sd::train::sum_of_squared_l2_norms(pieces); }, 1, 5);
  if (norm_in_turn != norm_shared) std::fprintf(stderr, "the two gradient norms differ\n");
  const std::vector<at::Tensor> bf16_pieces = g_bf16.split(int64_t{1} << 21);
  const auto bf16_norm = sd::bench::time_it([&] { sd::train::sum_of_squared_l2_norms(bf16_pieces); }, 1, 5);
  const int widest = sd::kernel_vector_bits();
  sd::set_kernel_vector_bits(256);
  const auto bf16_norm_avx2 = sd::bench::time_it([&] { sd::train::sum_of_squared_l2_norms(bf16_pieces); }, 1, 5);
  sd::set_kernel_vector_bits(widest);

  auto gbps = [&](double bytes_per_param, double s) { return bytes_per_param * static_cast<double>(n) / s / 1e9; };
  const nlohmann::json result = {{"parameters", n},
                                 {"libtorch_adamw", sd::bench::timing_json(libtorch)},
                                 {"fused_adamw", sd::bench::timing_json(ours)},
                                 {"adamw_then_ema_pass", sd::bench::timing_json(adamw_then_ema)},
                                 {"adamw_with_ema_in_its_pass", sd::bench::timing_json(adamw_with_ema)},
                                 {"bf16_step_float32_grads_then_refresh", sd::bench::timing_json(bf16_then_refresh)},
                                 {"bf16_step_bf16_grads_one_pass", sd::bench::timing_json(bf16_one_pass)},
                                 {"norm_pieces_in_turn", sd::bench::timing_json(pieces_in_turn)},
                                 {"norm_pieces_shared_by_threads", sd::bench::timing_json(pieces_shared)},
                                 {"norm_bf16_pieces", sd::bench::timing_json(bf16_norm)},
                                 {"norm_bf16_gb_per_s", gbps(2, bf16_norm.median_s)},
                                 {"norm_bf16_pieces_avx2", sd::bench::timing_json(bf16_norm_avx2)},
                                 {"kernel_vector_bits", widest},
                                 {"speedup", libtorch.median_s / ours.median_s},
                                 {"norm_speedup", pieces_in_turn.median_s / pieces_shared.median_s},
                                 {"fused_adamw_gb_per_s", gbps(28, ours.median_s)},
                                 {"libtorch_adamw_effective_gb_per_s", gbps(28, libtorch.median_s)},
                                 {"ema_in_pass_speedup", adamw_then_ema.median_s / adamw_with_ema.median_s},
                                 {"adamw_with_ema_gb_per_s", gbps(36, adamw_with_ema.median_s)},
                                 {"bf16_step_one_pass_speedup", bf16_then_refresh.median_s / bf16_one_pass.median_s}};
  std::printf("%s\n", result.dump().c_str());
}
