// The UNet's down, mid and up blocks (diffusers unet_2d_blocks.py): CrossAttnDownBlock2D / DownBlock2D,
// UNetMidBlock2DCrossAttn, CrossAttnUpBlock2D / UpBlock2D. The cross-attention and plain variants differ only by
// the Transformer2DModel after each resnet, so each pair is one class with an `attention` switch.
#pragma once
#include "models/unet/transformer_2d.h"

namespace sd::models {

// What every resnet of a UNet block shares.
struct ResnetSettings {
  int64_t temb_channels = 0;
  int64_t groups = 32;
  double eps = 1e-5;
  Activation act = Activation::SiLU;
};

// What every Transformer2DModel of a block shares; heads == 0 means no attention (DownBlock2D/UpBlock2D).
struct AttentionSettings {
  int64_t heads = 0;
  int64_t transformer_layers = 1;
  int64_t cross_attention_dim = 0;
  bool use_linear_projection = false;
  bool upcast_attention = false;
};

struct DownBlockOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t num_layers = 2;
  bool add_downsample = true;
  int64_t downsample_padding = 1;
  ResnetSettings resnet;
  AttentionSettings attention;
};

// resnets[i] (→ attentions[i]) for each layer, then downsamplers[0]. Each layer's output is kept for the skip
// connections to the up path.
class UNetDownBlockImpl : public torch::nn::Module {
 public:
  explicit UNetDownBlockImpl(const DownBlockOptions& options);
  // x: [N, Cin, H, W], temb: [N, T], context: [N, Lk, D] (ignored without attention)
  // -> skip tensors, the last one being the block output [N, Cout, H/2, W/2] (H, W without downsampler)
  std::vector<at::Tensor> forward(const at::Tensor& x, const at::Tensor& temb, const at::Tensor& context);
  bool has_attention() const { return !attention_blocks_.empty(); }

  torch::nn::ModuleList resnets, attentions, downsamplers;

 private:
  std::vector<ResnetBlock2D> resnet_blocks_;
  std::vector<Transformer2DModel> attention_blocks_;
  Downsample2D downsampler_{nullptr};
};
TORCH_MODULE(UNetDownBlock);

struct MidBlockOptions {
  int64_t channels = 0;
  int64_t num_layers = 1;
  double output_scale_factor = 1.0;
  ResnetSettings resnet;
  AttentionSettings attention;
};

// resnets[0], then (attentions[i] → resnets[i+1]) for each layer.
class UNetMidBlock2DCrossAttnImpl : public torch::nn::Module {
 public:
  explicit UNetMidBlock2DCrossAttnImpl(const MidBlockOptions& options);
  // x: [N, C, H, W], temb: [N, T], context: [N, Lk, D] -> [N, C, H, W]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& temb, const at::Tensor& context);

  torch::nn::ModuleList resnets, attentions;

 private:
  std::vector<ResnetBlock2D> resnet_blocks_;
  std::vector<Transformer2DModel> attention_blocks_;
};
TORCH_MODULE(UNetMidBlock2DCrossAttn);

struct UpBlockOptions {
  int64_t in_channels = 0;           // channels of the matching down block's input (the deepest skip)
  int64_t prev_output_channels = 0;  // channels coming from the block below
  int64_t out_channels = 0;
  int64_t num_layers = 3;
  bool add_upsample = true;
  ResnetSettings resnet;
  AttentionSettings attention;
};

// For each layer: concat the next skip tensor (taken from the back) on channels → resnets[i] (→ attentions[i]);
// then upsamplers[0].
class UNetUpBlockImpl : public torch::nn::Module {
 public:
  explicit UNetUpBlockImpl(const UpBlockOptions& options);
  // x: [N, Cprev, H, W], skips: num_layers tensors (consumed last-first), temb: [N, T], context: [N, Lk, D]
  // -> [N, Cout, 2H, 2W] (or upsample_size; H, W without upsampler)
  at::Tensor forward(const at::Tensor& x, const std::vector<at::Tensor>& skips, const at::Tensor& temb,
                     const at::Tensor& context,
                     const std::optional<std::vector<int64_t>>& upsample_size = std::nullopt);
  int64_t num_layers() const { return static_cast<int64_t>(resnet_blocks_.size()); }
  bool has_attention() const { return !attention_blocks_.empty(); }

  torch::nn::ModuleList resnets, attentions, upsamplers;

 private:
  std::vector<ResnetBlock2D> resnet_blocks_;
  std::vector<Transformer2DModel> attention_blocks_;
  Upsample2D upsampler_{nullptr};
};
TORCH_MODULE(UNetUpBlock);

}  // namespace sd::models
