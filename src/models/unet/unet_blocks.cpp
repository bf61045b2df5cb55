#include "models/unet/unet_blocks.h"

#include <ATen/ATen.h>

namespace sd::models {

namespace {

ResnetBlock2D make_resnet(int64_t in, int64_t out, const ResnetSettings& s, double output_scale_factor = 1.0) {
  ResnetBlock2DOptions o;
  o.in_channels = in;
  o.out_channels = out;
  o.temb_channels = s.temb_channels;
  o.groups = s.groups;
  o.eps = s.eps;
  o.act = s.act;
  o.output_scale_factor = output_scale_factor;
  return ResnetBlock2D(o);
}

// diffusers builds every SD Transformer2DModel with head dim = channels / heads and the resnets' group count.
Transformer2DModel make_transformer(int64_t channels, const AttentionSettings& a, int64_t groups) {
  Transformer2DOptions o;
  o.in_channels = channels;
  o.heads = a.heads;
  o.dim_head = channels / a.heads;
  o.num_layers = a.transformer_layers;
  o.cross_attention_dim = a.cross_attention_dim;
  o.norm_num_groups = groups;
  o.use_linear_projection = a.use_linear_projection;
  o.upcast_attention = a.upcast_attention;
  return Transformer2DModel(o);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

UNetDownBlockImpl::UNetDownBlockImpl(const DownBlockOptions& o) {
  for (int64_t i = 0; i < o.num_layers; ++i) {
    resnet_blocks_.push_back(make_resnet(i == 0 ? o.in_channels : o.out_channels, o.out_channels, o.resnet));
    resnets->push_back(resnet_blocks_.back());
    if (o.attention.heads > 0) {
      attention_blocks_.push_back(make_transformer(o.out_channels, o.attention, o.resnet.groups));
      attentions->push_back(attention_blocks_.back());
    }
  }
  register_module("resnets", resnets);
  if (!attention_blocks_.empty()) register_module("attentions", attentions);
  if (o.add_downsample) {
    downsampler_ = Downsample2D(o.out_channels, o.out_channels, o.downsample_padding);
    downsamplers->push_back(downsampler_);
    register_module("downsamplers", downsamplers);
  }
}

std::vector<at::Tensor> UNetDownBlockImpl::forward(const at::Tensor& x, const at::Tensor& temb,
                                                   const at::Tensor& context) {
  std::vector<at::Tensor> skips;
  at::Tensor h = x;
  for (size_t i = 0; i < resnet_blocks_.size(); ++i) {
    h = resnet_blocks_[i]->forward(h, temb);
    if (has_attention()) h = attention_blocks_[i]->forward(h, context);
    skips.push_back(h);
  }
  if (downsampler_) {
    h = downsampler_->forward(h);
    skips.push_back(h);
  }
  return skips;
}

// ---------------------------------------------------------------------------------------------------------------

UNetMidBlock2DCrossAttnImpl::UNetMidBlock2DCrossAttnImpl(const MidBlockOptions& o) {
  resnet_blocks_.push_back(make_resnet(o.channels, o.channels, o.resnet, o.output_scale_factor));
  resnets->push_back(resnet_blocks_.back());
  for (int64_t i = 0; i < o.num_layers; ++i) {
    attention_blocks_.push_back(make_transformer(o.channels, o.attention, o.resnet.groups));
    attentions->push_back(attention_blocks_.back());
    resnet_blocks_.push_back(make_resnet(o.channels, o.channels, o.resnet, o.output_scale_factor));
    resnets->push_back(resnet_blocks_.back());
  }
  register_module("attentions", attentions);
  register_module("resnets", resnets);
}

at::Tensor UNetMidBlock2DCrossAttnImpl::forward(const at::Tensor& x, const at::Tensor& temb,
                                                const at::Tensor& context) {
  at::Tensor h = resnet_blocks_[0]->forward(x, temb);
  for (size_t i = 0; i < attention_blocks_.size(); ++i) {
    h = attention_blocks_[i]->forward(h, context);
    h = resnet_blocks_[i + 1]->forward(h, temb);
  }
  return h;
}

// ---------------------------------------------------------------------------------------------------------------

UNetUpBlockImpl::UNetUpBlockImpl(const UpBlockOptions& o) {
  for (int64_t i = 0; i < o.num_layers; ++i) {
    const int64_t skip_channels = (i == o.num_layers - 1) ? o.in_channels : o.out_channels;
    const int64_t resnet_in = (i == 0) ? o.prev_output_channels : o.out_channels;
    resnet_blocks_.push_back(make_resnet(resnet_in + skip_channels, o.out_channels, o.resnet));
    resnets->push_back(resnet_blocks_.back());
    if (o.attention.heads > 0) {
      attention_blocks_.push_back(make_transformer(o.out_channels, o.attention, o.resnet.groups));
      attentions->push_back(attention_blocks_.back());
    }
  }
  register_module("resnets", resnets);
  if (!attention_blocks_.empty()) register_module("attentions", attentions);
  if (o.add_upsample) {
    upsampler_ = Upsample2D(o.out_channels, o.out_channels);
    upsamplers->push_back(upsampler_);
    register_module("upsamplers", upsamplers);
  }
}

at::Tensor UNetUpBlockImpl::forward(const at::Tensor& x, const std::vector<at::Tensor>& skips, const at::Tensor& temb,
                                    const at::Tensor& context,
                                    const std::optional<std::vector<int64_t>>& upsample_size) {
  at::Tensor h = x;
  for (size_t i = 0; i < resnet_blocks_.size(); ++i) {
    h = at::cat({h, skips[skips.size() - 1 - i]}, 1);
    h = resnet_blocks_[i]->forward(h, temb);
    if (has_attention()) h = attention_blocks_[i]->forward(h, context);
  }
  if (upsampler_) h = upsampler_->forward(h, upsample_size);
  return h;
}

}  // namespace sd::models
