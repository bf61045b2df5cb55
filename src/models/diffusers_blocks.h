// The building blocks diffusers 0.24 shares between the UNet and the VAE (resnet.py, attention_processor.py):
// ResnetBlock2D, Downsample2D, Upsample2D and Attention, with diffusers' parameter names and op order.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/normalization.h>

#include <optional>
#include <string>
#include <vector>

#include "models/lora.h"

namespace sd::models {

// diffusers' get_activation(): "silu"/"swish", "mish", "gelu", "relu".
enum class Activation { SiLU, Mish, GELU, ReLU };
// Throws sd::Error "<where>: unknown activation ..." for any other name.
Activation parse_activation(const std::string& name, const std::string& where);
at::Tensor activate(Activation act, const at::Tensor& x);

// Norms in reduced precision: LibTorch 1.13's CPU group_norm/layer_norm reject a bf16 input with float32 weights,
// and their bf16 kernels (bf16 weights) lose ~5x more than rounding the float32 result to bf16. So a bf16/f16
// input is normalised in float32 (weights upcast too) and cast back — what autocast does on GPUs. On a CPU with AVX2
// float32 and bf16 inputs take models/fused_norm.h's kernels (one autograd node, fewer passes than LibTorch's; float32
// results equal LibTorch's up to summation order); float64 inputs and other devices take LibTorch's own norms.
at::Tensor group_norm(const torch::nn::GroupNorm& norm, const at::Tensor& x);
at::Tensor layer_norm(const torch::nn::LayerNorm& norm, const at::Tensor& x);

// Multi-head attention as diffusers' AttnProcessor computes it (torch 1.13 has no scaled_dot_product_attention):
// scores = baddbmm(empty, q, kᵀ, beta=0, alpha=scale); softmax; bmm with v. `upcast_attention` computes the
// scores from float32 q and k, `upcast_softmax` runs the softmax in float32; probabilities go back to q's dtype.
// Inference (no grad) at large sizes runs models/tiled_attention.h instead, which never holds all the scores.
// q: [B*heads, Lq, d], k, v: [B*heads, Lk, d] -> [B*heads, Lq, d]
at::Tensor scaled_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                            bool upcast_attention, bool upcast_softmax);

struct ResnetBlock2DOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t temb_channels = 0;  // 0: no time embedding (the VAE's resnets)
  int64_t groups = 32;
  double eps = 1e-6;
  double output_scale_factor = 1.0;
  Activation act = Activation::SiLU;
};

// GroupNorm → act → conv1 (+ time_emb_proj(act(temb))) → GroupNorm → act → conv2, plus the (1×1 conv) shortcut.
class ResnetBlock2DImpl : public torch::nn::Module {
 public:
  explicit ResnetBlock2DImpl(const ResnetBlock2DOptions& options);
  // x: [N, Cin, H, W], temb: [N, T] or undefined -> [N, Cout, H, W]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& temb = {});

  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  Conv2d conv1{nullptr}, conv2{nullptr}, conv_shortcut{nullptr};
  Linear time_emb_proj{nullptr};

 private:
  ResnetBlock2DOptions options_;
};
TORCH_MODULE(ResnetBlock2D);

// 3×3 stride-2 conv. padding 0 (the VAE) first pads right and bottom by one, as diffusers does.
class Downsample2DImpl : public torch::nn::Module {
 public:
  Downsample2DImpl(int64_t channels, int64_t out_channels, int64_t padding);
  // x: [N, C, H, W] -> [N, Cout, ceil(H/2), ceil(W/2)]
  at::Tensor forward(const at::Tensor& x);

  Conv2d conv{nullptr};

 private:
  int64_t padding_;
};
TORCH_MODULE(Downsample2D);

// Nearest ×2 (or to `output_size`, for inputs not divisible by the UNet's total downscale) then a 3×3 conv.
class Upsample2DImpl : public torch::nn::Module {
 public:
  Upsample2DImpl(int64_t channels, int64_t out_channels);
  // x: [N, C, H, W] -> [N, Cout, 2H, 2W] (or output_size)
  at::Tensor forward(const at::Tensor& x, const std::optional<std::vector<int64_t>>& output_size = std::nullopt);

  Conv2d conv{nullptr};
};
TORCH_MODULE(Upsample2D);

struct AttentionOptions {
  int64_t query_dim = 0;
  int64_t cross_attention_dim = 0;  // 0: self-attention (keys/values from the query input)
  int64_t heads = 8;
  int64_t dim_head = 64;
  bool bias = false;  // to_q/to_k/to_v bias
  bool out_bias = true;
  bool upcast_attention = false;
  bool upcast_softmax = false;
  int64_t norm_num_groups = 0;  // >0: a GroupNorm over channels before the projections (the VAE mid-block)
  double eps = 1e-5;
  bool residual_connection = false;
  double rescale_output_factor = 1.0;
};

// diffusers' Attention module with the default AttnProcessor. Parameters: to_q, to_k, to_v, to_out.0,
// optional group_norm.
class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const AttentionOptions& options);
  // hidden: [N, L, query_dim] or [N, C, H, W] (flattened to L = H*W tokens and restored);
  // context: [N, Lk, cross_attention_dim] or undefined (self-attention) -> same shape as hidden
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& context = {});
  // Training too runs the tiled attention (models/tiled_attention.h): no probabilities kept for backward (512 MiB
  // per SD-1.5 self-attention at 512² and batch 1), at the cost of a slower backward (diffusers'
  // enable_xformers_memory_efficient_attention, in effect). Heads of up to 16 channels take their fused kernel either
  // way, which keeps no probabilities either; inference keeps none on any path.
  void set_memory_efficient(bool enabled) { memory_efficient_ = enabled; }

  torch::nn::GroupNorm group_norm{nullptr};
  Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr};
  torch::nn::ModuleList to_out;  // [Linear, Dropout], as diffusers registers it

 private:
  // The heads' attention: the fused kernels for heads of a few channels (models/small_head_attention.h) and for
  // wider float32 or bf16 heads (models/wide_head_attention.h), else the tiled or the plain path on [B*heads, L, d]
  // slices.
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const;

  AttentionOptions options_;
  Linear to_out_proj_{nullptr};
  double scale_;
  bool memory_efficient_ = false;
};
TORCH_MODULE(Attention);

}  // namespace sd::models
