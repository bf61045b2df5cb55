#include "models/vae/autoencoder_kl.h"

#include <ATen/ATen.h>

#include "core/error.h"
#include "models/lora.h"
#include "models/weights.h"

namespace sd::models {

namespace nn = torch::nn;

// The VAE's norms use eps 1e-6 throughout (diffusers hard-codes it in Encoder/Decoder).
constexpr double kVaeEps = 1e-6;

DiagonalGaussian DiagonalGaussian::from_moments(const at::Tensor& moments) {
  DiagonalGaussian d;
  auto halves = moments.chunk(2, 1);
  d.mean = halves[0];
  d.logvar = at::clamp(halves[1], -30.0, 20.0);
  d.std = at::exp(0.5 * d.logvar);
  d.var = at::exp(d.logvar);
  return d;
}

at::Tensor DiagonalGaussian::sample(at::Generator generator) const {
  return sample(at::randn(mean.sizes(), generator, mean.options()));
}

at::Tensor DiagonalGaussian::sample(const at::Tensor& eps) const {
  SD_CHECK(eps.sizes() == mean.sizes(), "DiagonalGaussian::sample: eps shape differs from the mean's");
  return mean + std * eps.to(mean.options());
}

namespace {
ResnetBlock2D vae_resnet(int64_t in, int64_t out, int64_t groups, Activation act) {
  ResnetBlock2DOptions o;
  o.in_channels = in;
  o.out_channels = out;
  o.groups = groups;
  o.eps = kVaeEps;
  o.act = act;
  return ResnetBlock2D(o);
}
}  // namespace

// ---------------------------------------------------------------------------------------------------------------

DownEncoderBlock2DImpl::DownEncoderBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t num_layers,
                                               bool add_downsample, int64_t groups, Activation act) {
  for (int64_t i = 0; i < num_layers; ++i) {
    resnet_blocks_.push_back(vae_resnet(i == 0 ? in_channels : out_channels, out_channels, groups, act));
    resnets->push_back(resnet_blocks_.back());
  }
  register_module("resnets", resnets);
  if (add_downsample) {
    downsampler_ = Downsample2D(out_channels, out_channels, /*padding=*/0);
    downsamplers->push_back(downsampler_);
    register_module("downsamplers", downsamplers);
  }
}

at::Tensor DownEncoderBlock2DImpl::forward(const at::Tensor& x) {
  at::Tensor h = x;
  for (auto& r : resnet_blocks_) h = r->forward(h);
  if (downsampler_) h = downsampler_->forward(h);
  return h;
}

UpDecoderBlock2DImpl::UpDecoderBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t num_layers,
                                           bool add_upsample, int64_t groups, Activation act) {
  for (int64_t i = 0; i < num_layers; ++i) {
    resnet_blocks_.push_back(vae_resnet(i == 0 ? in_channels : out_channels, out_channels, groups, act));
    resnets->push_back(resnet_blocks_.back());
  }
  register_module("resnets", resnets);
  if (add_upsample) {
    upsampler_ = Upsample2D(out_channels, out_channels);
    upsamplers->push_back(upsampler_);
    register_module("upsamplers", upsamplers);
  }
}

at::Tensor UpDecoderBlock2DImpl::forward(const at::Tensor& x) {
  at::Tensor h = x;
  for (auto& r : resnet_blocks_) h = r->forward(h);
  if (upsampler_) h = upsampler_->forward(h);
  return h;
}

VaeMidBlockImpl::VaeMidBlockImpl(int64_t channels, int64_t groups, Activation act) {
  // diffusers 0.24 passes attention_head_dim = channels, so heads = 1 and the head spans all channels.
  AttentionOptions a;
  a.query_dim = channels;
  a.heads = 1;
  a.dim_head = channels;
  a.bias = true;
  a.upcast_softmax = true;
  a.norm_num_groups = groups;
  a.eps = kVaeEps;
  a.residual_connection = true;
  resnet_blocks_.push_back(vae_resnet(channels, channels, groups, act));
  attention_ = Attention(a);
  resnet_blocks_.push_back(vae_resnet(channels, channels, groups, act));
  attentions->push_back(attention_);
  resnets->push_back(resnet_blocks_[0]);
  resnets->push_back(resnet_blocks_[1]);
  register_module("attentions", attentions);
  register_module("resnets", resnets);
}

at::Tensor VaeMidBlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = resnet_blocks_[0]->forward(x);
  h = attention_->forward(h);
  return resnet_blocks_[1]->forward(h);
}

// ---------------------------------------------------------------------------------------------------------------

EncoderImpl::EncoderImpl(const VaeConfig& c) : act_(parse_activation(c.act_fn, c.source + ": key 'act_fn'")) {
  const auto& ch = c.block_out_channels;
  const size_t n = ch.size();
  conv_in = register_module("conv_in", nn::Conv2d(nn::Conv2dOptions(c.in_channels, ch[0], 3).padding(1)));
  int64_t out = ch[0];
  for (size_t i = 0; i < n; ++i) {
    const int64_t in = out;
    out = ch[i];
    down_.push_back(DownEncoderBlock2D(in, out, c.layers_per_block, i + 1 < n, c.norm_num_groups, act_));
    down_blocks->push_back(down_.back());
  }
  register_module("down_blocks", down_blocks);
  mid_block = register_module("mid_block", VaeMidBlock(ch[n - 1], c.norm_num_groups, act_));
  conv_norm_out =
      register_module("conv_norm_out", nn::GroupNorm(nn::GroupNormOptions(c.norm_num_groups, ch[n - 1]).eps(kVaeEps)));
  conv_out = register_module("conv_out", nn::Conv2d(nn::Conv2dOptions(ch[n - 1], 2 * c.latent_channels, 3).padding(1)));
}

at::Tensor EncoderImpl::forward(const at::Tensor& x) {
  at::Tensor h = conv_in->forward(x);
  for (auto& block : down_) h = block->forward(h);
  h = mid_block->forward(h);
  return conv_out->forward(activate(act_, group_norm(conv_norm_out, h)));
}

DecoderImpl::DecoderImpl(const VaeConfig& c) : act_(parse_activation(c.act_fn, c.source + ": key 'act_fn'")) {
  const auto& ch = c.block_out_channels;
  const size_t n = ch.size();
  conv_in = register_module("conv_in", nn::Conv2d(nn::Conv2dOptions(c.latent_channels, ch[n - 1], 3).padding(1)));
  mid_block = register_module("mid_block", VaeMidBlock(ch[n - 1], c.norm_num_groups, act_));
  int64_t out = ch[n - 1];
  for (size_t i = 0; i < n; ++i) {
    const int64_t prev = out;
    out = ch[n - 1 - i];
    up_.push_back(UpDecoderBlock2D(prev, out, c.layers_per_block + 1, i + 1 < n, c.norm_num_groups, act_));
    up_blocks->push_back(up_.back());
  }
  register_module("up_blocks", up_blocks);
  conv_norm_out =
      register_module("conv_norm_out", nn::GroupNorm(nn::GroupNormOptions(c.norm_num_groups, ch[0]).eps(kVaeEps)));
  conv_out = register_module("conv_out", nn::Conv2d(nn::Conv2dOptions(ch[0], c.out_channels, 3).padding(1)));
}

at::Tensor DecoderImpl::forward(const at::Tensor& z) {
  at::Tensor h = conv_in->forward(z);
  h = mid_block->forward(h);
  // diffusers casts to the up blocks' dtype here (a no-op unless the mid block runs in another dtype).
  h = h.to(up_.front()->resnets->parameters().front().scalar_type());
  for (auto& block : up_) h = block->forward(h);
  return conv_out->forward(activate(act_, group_norm(conv_norm_out, h)));
}

// ---------------------------------------------------------------------------------------------------------------

AutoencoderKLImpl::AutoencoderKLImpl(VaeConfig config) : config_(std::move(config)) {
  config_.validate();
  const int64_t latent = config_.latent_channels;
  encoder = register_module("encoder", Encoder(config_));
  decoder = register_module("decoder", Decoder(config_));
  quant_conv = register_module("quant_conv", nn::Conv2d(nn::Conv2dOptions(2 * latent, 2 * latent, 1)));
  post_quant_conv = register_module("post_quant_conv", nn::Conv2d(nn::Conv2dOptions(latent, latent, 1)));
}

DiagonalGaussian AutoencoderKLImpl::encode(const at::Tensor& image) {
  SD_CHECK(image.dim() == 4 && image.size(1) == config_.in_channels, "VAE: image must be [N, {}, H, W]",
           config_.in_channels);
  return DiagonalGaussian::from_moments(quant_conv->forward(encoder->forward(image)));
}

at::Tensor AutoencoderKLImpl::decode(const at::Tensor& latents) {
  SD_CHECK(latents.dim() == 4 && latents.size(1) == config_.latent_channels, "VAE: latents must be [N, {}, h, w]",
           config_.latent_channels);
  return decoder->forward(post_quant_conv->forward(latents));
}

AutoencoderKL load_vae(const std::filesystem::path& dir, at::ScalarType dtype, const std::string& variant) {
  VaeConfig config = VaeConfig::load((dir / "config.json").string());
  return load_vae(std::move(config), *open_weights(dir, WeightFileNames::diffusers(), variant), dtype);
}

AutoencoderKL load_vae(VaeConfig config, const io::TensorFile& weights, at::ScalarType dtype) {
  SD_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kDouble,
           "load_vae: dtype must be float32, bfloat16 or float64, got {}", c10::toString(dtype));
  AutoencoderKL model = [&] {
    ScopedDefaultDtype built_in(dtype);
    ScopedUninitializedLayers weights_read_next;
    return AutoencoderKL(std::move(config));
  }();
  load_weights(*model, weights);
  return model;
}

// ---------------------------------------------------------------------------------------------------------------

namespace {
int64_t conv(int64_t in, int64_t out, int64_t k) { return in * out * k * k + out; }
int64_t resnet(int64_t in, int64_t out) {
  return 2 * in + conv(in, out, 3) + 2 * out + conv(out, out, 3) + (in != out ? conv(in, out, 1) : 0);
}
int64_t mid_block(int64_t c) { return 2 * resnet(c, c) + 2 * c + 4 * (c * c + c); }
}  // namespace

int64_t count_parameters(const VaeConfig& c) {
  c.validate();
  const auto& ch = c.block_out_channels;
  const size_t n = ch.size();
  const int64_t latent = c.latent_channels;
  int64_t enc = conv(c.in_channels, ch[0], 3);
  int64_t out = ch[0];
  for (size_t i = 0; i < n; ++i) {
    const int64_t in = out;
    out = ch[i];
    for (int64_t l = 0; l < c.layers_per_block; ++l) enc += resnet(l == 0 ? in : out, out);
    if (i + 1 < n) enc += conv(out, out, 3);
  }
  enc += mid_block(ch[n - 1]) + 2 * ch[n - 1] + conv(ch[n - 1], 2 * latent, 3);

  int64_t dec = conv(latent, ch[n - 1], 3) + mid_block(ch[n - 1]);
  out = ch[n - 1];
  for (size_t i = 0; i < n; ++i) {
    const int64_t prev = out;
    out = ch[n - 1 - i];
    for (int64_t l = 0; l < c.layers_per_block + 1; ++l) dec += resnet(l == 0 ? prev : out, out);
    if (i + 1 < n) dec += conv(out, out, 3);
  }
  dec += 2 * ch[0] + conv(ch[0], c.out_channels, 3);
  return enc + dec + conv(2 * latent, 2 * latent, 1) + conv(latent, latent, 1);
}

}  // namespace sd::models
