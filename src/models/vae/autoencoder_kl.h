// AutoencoderKL (diffusers 0.24), SD's VAE: images <-> latents, with the diagonal Gaussian posterior of encode().
#pragma once
#include <ATen/core/Generator.h>
#include <torch/nn/modules/conv.h>

#include <filesystem>
#include <string>

#include "io/tensor_file.h"
#include "models/diffusers_blocks.h"
#include "models/vae/vae_config.h"

namespace sd::models {

// diffusers' DiagonalGaussianDistribution over [N, 2*latent, h, w] moments (mean and log-variance halves).
struct DiagonalGaussian {
  at::Tensor mean, logvar, std, var;  // [N, latent, h, w]; logvar clamped to [-30, 20]

  static DiagonalGaussian from_moments(const at::Tensor& moments);
  // mean + std * eps with eps ~ N(0, 1) drawn from `generator` in the mean's dtype (as diffusers' randn_tensor).
  at::Tensor sample(at::Generator generator) const;
  // mean + std * eps for a given eps (replaying a recorded draw).
  at::Tensor sample(const at::Tensor& eps) const;
  at::Tensor mode() const { return mean; }
};

// resnets (no time embedding) then an optional downsampler (padding 0: asymmetric pad).
class DownEncoderBlock2DImpl : public torch::nn::Module {
 public:
  DownEncoderBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t num_layers, bool add_downsample,
                         int64_t groups, Activation act);
  // x: [N, Cin, H, W] -> [N, Cout, H/2, W/2] (H, W without downsampler)
  at::Tensor forward(const at::Tensor& x);

  torch::nn::ModuleList resnets, downsamplers;

 private:
  std::vector<ResnetBlock2D> resnet_blocks_;
  Downsample2D downsampler_{nullptr};
};
TORCH_MODULE(DownEncoderBlock2D);

// resnets then an optional nearest ×2 upsampler.
class UpDecoderBlock2DImpl : public torch::nn::Module {
 public:
  UpDecoderBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t num_layers, bool add_upsample, int64_t groups,
                       Activation act);
  // x: [N, Cin, H, W] -> [N, Cout, 2H, 2W] (H, W without upsampler)
  at::Tensor forward(const at::Tensor& x);

  torch::nn::ModuleList resnets, upsamplers;

 private:
  std::vector<ResnetBlock2D> resnet_blocks_;
  Upsample2D upsampler_{nullptr};
};
TORCH_MODULE(UpDecoderBlock2D);

// resnets[0] → attentions[0] (single-head self-attention over all pixels, with group_norm and residual) →
// resnets[1]. diffusers' UNetMidBlock2D as the VAE builds it.
class VaeMidBlockImpl : public torch::nn::Module {
 public:
  VaeMidBlockImpl(int64_t channels, int64_t groups, Activation act);
  // x: [N, C, H, W] -> [N, C, H, W]
  at::Tensor forward(const at::Tensor& x);

  torch::nn::ModuleList resnets, attentions;

 private:
  std::vector<ResnetBlock2D> resnet_blocks_;
  Attention attention_{nullptr};
};
TORCH_MODULE(VaeMidBlock);

//   image ─ conv_in ─ down_blocks ─ mid_block ─ conv_norm_out ─ act ─ conv_out → [N, 2*latent, H/f, W/f]
class EncoderImpl : public torch::nn::Module {
 public:
  explicit EncoderImpl(const VaeConfig& config);
  // x: [N, in_channels, H, W] -> [N, 2*latent_channels, H/2^(blocks-1), W/2^(blocks-1)]
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  torch::nn::ModuleList down_blocks;
  VaeMidBlock mid_block{nullptr};
  torch::nn::GroupNorm conv_norm_out{nullptr};

 private:
  std::vector<DownEncoderBlock2D> down_;
  Activation act_;
};
TORCH_MODULE(Encoder);

//   latents ─ conv_in ─ mid_block ─ up_blocks ─ conv_norm_out ─ act ─ conv_out → [N, out_channels, H, W]
class DecoderImpl : public torch::nn::Module {
 public:
  explicit DecoderImpl(const VaeConfig& config);
  // z: [N, latent_channels, h, w] -> [N, out_channels, h*2^(blocks-1), w*2^(blocks-1)]
  at::Tensor forward(const at::Tensor& z);

  torch::nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  VaeMidBlock mid_block{nullptr};
  torch::nn::ModuleList up_blocks;
  torch::nn::GroupNorm conv_norm_out{nullptr};

 private:
  std::vector<UpDecoderBlock2D> up_;
  Activation act_;
};
TORCH_MODULE(Decoder);

class AutoencoderKLImpl : public torch::nn::Module {
 public:
  explicit AutoencoderKLImpl(VaeConfig config);

  // image: [N, in_channels, H, W] in [-1, 1] -> posterior over [N, latent, H/f, W/f] (no scaling_factor applied)
  DiagonalGaussian encode(const at::Tensor& image);
  // latents: [N, latent, h, w] (already divided by scaling_factor) -> [N, out_channels, h*f, w*f]
  at::Tensor decode(const at::Tensor& latents);

  const VaeConfig& config() const { return config_; }
  double scaling_factor() const { return config_.scaling_factor; }

  Encoder encoder{nullptr};
  Decoder decoder{nullptr};
  torch::nn::Conv2d quant_conv{nullptr}, post_quant_conv{nullptr};

 private:
  VaeConfig config_;
};
TORCH_MODULE(AutoencoderKL);

// Reads a diffusers `vae/` folder (config.json and the weights open_weights picks, of `variant` if given) into a
// model of `dtype` (float32, bfloat16 or float64).
AutoencoderKL load_vae(const std::filesystem::path& dir, at::ScalarType dtype = at::kFloat,
                       const std::string& variant = "");
// The same from a config and weights already opened (e.g. the VAE part of a single-file checkpoint).
AutoencoderKL load_vae(VaeConfig config, const io::TensorFile& weights, at::ScalarType dtype = at::kFloat);

// Parameters an AutoencoderKL built from `config` has, from the config alone.
int64_t count_parameters(const VaeConfig& config);

}  // namespace sd::models
