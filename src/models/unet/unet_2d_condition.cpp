#include "models/unet/unet_2d_condition.h"

#include <ATen/ATen.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "core/error.h"
#include "models/checkpoint.h"
#include "models/lora.h"
#include "models/weights.h"

namespace sd::models {

namespace nn = torch::nn;

at::Tensor timestep_embedding(const at::Tensor& timesteps, int64_t dim, bool flip_sin_to_cos, double freq_shift) {
  const int64_t half = dim / 2;
  // Same ops in the same order as diffusers, so the float32 rounding matches bit for bit.
  at::Tensor exponent = at::arange(0, half, timesteps.options().dtype(at::kFloat)) * (-std::log(10000.0));
  exponent = exponent / (static_cast<double>(half) - freq_shift);
  at::Tensor emb = timesteps.unsqueeze(1).to(at::kFloat) * exponent.exp().unsqueeze(0);  // [N, half]
  emb = at::cat({emb.sin(), emb.cos()}, -1);
  if (flip_sin_to_cos) emb = at::cat({emb.narrow(1, half, half), emb.narrow(1, 0, half)}, -1);
  if (dim % 2 == 1) emb = at::constant_pad_nd(emb, {0, 1, 0, 0}, 0);
  return emb;
}

TimestepEmbeddingImpl::TimestepEmbeddingImpl(int64_t in_channels, int64_t time_embed_dim, Activation act) : act_(act) {
  linear_1 = register_module("linear_1", Linear(in_channels, time_embed_dim));
  linear_2 = register_module("linear_2", Linear(time_embed_dim, time_embed_dim));
}

at::Tensor TimestepEmbeddingImpl::forward(const at::Tensor& x) {
  return linear_2->forward(activate(act_, linear_1->forward(x)));
}

// ---------------------------------------------------------------------------------------------------------------

UNet2DConditionModelImpl::UNet2DConditionModelImpl(UNetConfig config) : config_(std::move(config)) {
  const UNetConfig& c = config_;
  c.validate();
  act_ = parse_activation(c.act_fn, c.source + ": key 'act_fn'");
  const size_t n = c.num_blocks();
  const auto& channels = c.block_out_channels;
  const int64_t time_dim = c.time_embed_dim();

  conv_in = register_module(
      "conv_in",
      Conv2d(nn::Conv2dOptions(c.in_channels, channels[0], c.conv_in_kernel).padding((c.conv_in_kernel - 1) / 2)));
  time_embedding = register_module("time_embedding", TimestepEmbedding(channels[0], time_dim, act_));

  ResnetSettings resnet;
  resnet.temb_channels = time_dim;
  resnet.groups = *c.norm_num_groups;
  resnet.eps = c.norm_eps;
  resnet.act = act_;
  auto attention_for = [&](size_t block, bool cross_attention) {
    AttentionSettings a;
    if (!cross_attention) return a;
    a.heads = c.heads(block);
    a.transformer_layers = c.transformer_layers_per_block.at(block);
    a.cross_attention_dim = c.cross_attention_dim.at(block);
    a.use_linear_projection = c.use_linear_projection;
    a.upcast_attention = c.upcast_attention;
    return a;
  };

  int64_t output_channel = channels[0];
  for (size_t i = 0; i < n; ++i) {
    DownBlockOptions o;
    o.in_channels = output_channel;
    o.out_channels = output_channel = channels[i];
    o.num_layers = c.layers_per_block.at(i);
    o.add_downsample = i + 1 < n;
    o.downsample_padding = c.downsample_padding;
    o.resnet = resnet;
    o.attention = attention_for(i, c.down_block_types[i] == "CrossAttnDownBlock2D");
    down_.push_back(UNetDownBlock(o));
    down_blocks->push_back(down_.back());
  }
  register_module("down_blocks", down_blocks);

  if (c.mid_block_type) {
    MidBlockOptions o;
    o.channels = channels[n - 1];
    o.output_scale_factor = c.mid_block_scale_factor;
    o.resnet = resnet;
    o.attention = attention_for(n - 1, true);
    mid_block = register_module("mid_block", UNetMidBlock2DCrossAttn(o));
  }

  // Up block i mirrors down block n-1-i: same channels, heads and cross-attention dim, one more resnet.
  output_channel = channels[n - 1];
  for (size_t i = 0; i < n; ++i) {
    const size_t mirror = n - 1 - i;
    UpBlockOptions o;
    o.prev_output_channels = output_channel;
    o.out_channels = output_channel = channels[mirror];
    o.in_channels = channels[mirror == 0 ? 0 : mirror - 1];
    o.num_layers = c.layers_per_block.at(mirror) + 1;
    o.add_upsample = i + 1 < n;
    o.resnet = resnet;
    o.attention = attention_for(mirror, c.up_block_types[i] == "CrossAttnUpBlock2D");
    up_.push_back(UNetUpBlock(o));
    up_blocks->push_back(up_.back());
  }
  register_module("up_blocks", up_blocks);

  conv_norm_out = register_module("conv_norm_out",
                                  nn::GroupNorm(nn::GroupNormOptions(*c.norm_num_groups, channels[0]).eps(c.norm_eps)));
  conv_out = register_module(
      "conv_out",
      Conv2d(nn::Conv2dOptions(channels[0], c.out_channels, c.conv_out_kernel).padding((c.conv_out_kernel - 1) / 2)));
}

namespace {
std::string shape_str(at::IntArrayRef s) { return fmt::format("[{}]", fmt::join(s, ", ")); }
}  // namespace

void UNet2DConditionModelImpl::set_memory_options(const UNetMemoryOptions& o) {
  set_checkpointed_levels(o.gradient_checkpointing_levels.value_or(o.gradient_checkpointing ? resolution_levels() : 0));
  set_memory_efficient_attention(o.memory_efficient_attention);
}

void UNet2DConditionModelImpl::set_checkpointed_levels(int levels) {
  SD_CHECK(levels >= 0 && levels <= resolution_levels(),
           "gradient checkpointing of {} resolution levels: this UNet has {} (its down blocks)", levels,
           resolution_levels());
  checkpointed_levels_ = levels;
}

void UNet2DConditionModelImpl::set_memory_efficient_attention(bool enabled) {
  for (const auto& module : modules())
    if (auto* attention = dynamic_cast<AttentionImpl*>(module.get())) attention->set_memory_efficient(enabled);
}

namespace {

// Where forward first uses parameter `name`: (stage, block, layer within the block). Names as diffusers has them.
std::tuple<int, int64_t, int64_t> forward_position(const std::string& name) {
  static const std::vector<std::string> stages = {"time_embedding", "conv_in",       "down_blocks", "mid_block",
                                                  "up_blocks",      "conv_norm_out", "conv_out"};
  std::vector<std::string> parts;
  for (size_t begin = 0, end; begin <= name.size(); begin = end + 1) {
    end = std::min(name.find('.', begin), name.size());
    parts.push_back(name.substr(begin, end - begin));
  }
  const auto stage = static_cast<int>(std::find(stages.begin(), stages.end(), parts[0]) - stages.begin());
  const bool in_block_list = parts[0] == "down_blocks" || parts[0] == "up_blocks";
  const size_t layer_part = in_block_list ? 2 : 1;
  const int64_t block = in_block_list ? std::stoll(parts[1]) : 0;
  int64_t layer = 0;  // a block runs resnets[j], attentions[j] for j = 0, 1, ..., then its down/upsampler
  if (parts.size() > layer_part + 1) {
    const std::string& kind = parts[layer_part];
    if (kind == "resnets") layer = 2 * std::stoll(parts[layer_part + 1]);
    if (kind == "attentions") layer = 2 * std::stoll(parts[layer_part + 1]) + 1;
    if (kind == "downsamplers" || kind == "upsamplers") layer = std::numeric_limits<int64_t>::max();
  }
  return {stage, block, layer};
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> UNet2DConditionModelImpl::named_parameters_in_forward_order() const {
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& item : named_parameters(/*recurse=*/true)) params.emplace_back(item.key(), item.value());
  // Stable: inside a layer, registration order is forward order.
  std::stable_sort(params.begin(), params.end(),
                   [](const auto& a, const auto& b) { return forward_position(a.first) < forward_position(b.first); });
  return params;
}

std::vector<at::Tensor> UNet2DConditionModelImpl::run_down(size_t i, const at::Tensor& h, const at::Tensor& temb,
                                                           const at::Tensor& context) {
  UNetDownBlock block = down_[i];
  if (!checkpoints_level(i)) return block->forward(h, temb, context);
  at::Tensor ctx = block->has_attention() ? context : at::Tensor();
  auto impl = block.ptr();
  return checkpoint([impl](const TensorList& in) { return impl->forward(in[0], in[1], in[2]); }, {h, temb, ctx},
                    parameters_and_adapters(*impl));
}

at::Tensor UNet2DConditionModelImpl::run_mid(const at::Tensor& h, const at::Tensor& temb, const at::Tensor& context) {
  UNetMidBlock2DCrossAttn block = mid_block;
  if (!checkpoints_level(down_.size() - 1)) return block->forward(h, temb, context);
  auto impl = block.ptr();
  return checkpoint([impl](const TensorList& in) { return TensorList{impl->forward(in[0], in[1], in[2])}; },
                    {h, temb, context}, parameters_and_adapters(*impl))[0];
}

at::Tensor UNet2DConditionModelImpl::run_up(size_t i, const at::Tensor& h, const std::vector<at::Tensor>& skips,
                                            const at::Tensor& temb, const at::Tensor& context,
                                            const std::optional<std::vector<int64_t>>& upsample_size) {
  UNetUpBlock block = up_[i];
  if (!checkpoints_level(up_.size() - 1 - i)) return block->forward(h, skips, temb, context, upsample_size);
  TensorList inputs{h, temb, block->has_attention() ? context : at::Tensor()};
  inputs.insert(inputs.end(), skips.begin(), skips.end());
  auto impl = block.ptr();
  auto fn = [impl, upsample_size](const TensorList& in) {
    TensorList block_skips(in.begin() + 3, in.end());
    return TensorList{impl->forward(in[0], block_skips, in[1], in[2], upsample_size)};
  };
  return checkpoint(fn, inputs, parameters_and_adapters(*impl))[0];
}

at::Tensor UNet2DConditionModelImpl::forward(const at::Tensor& sample_in, const at::Tensor& timestep,
                                             const at::Tensor& encoder_hidden_states) {
  const UNetConfig& c = config_;
  SD_CHECK(sample_in.dim() == 4 && sample_in.size(1) == c.in_channels, "UNet: sample must be [N, {}, H, W], got {}",
           c.in_channels, shape_str(sample_in.sizes()));
  SD_CHECK(sample_in.scalar_type() == conv_in->weight.scalar_type(),
           "UNet: sample dtype {} differs from the model's {}", c10::toString(sample_in.scalar_type()),
           c10::toString(conv_in->weight.scalar_type()));
  const int64_t batch = sample_in.size(0);
  SD_CHECK(encoder_hidden_states.dim() == 3 && encoder_hidden_states.size(0) == batch &&
               encoder_hidden_states.size(2) == c.cross_attention_dim.at(0),
           "UNet: encoder_hidden_states must be [{}, L, {}], got {}", batch, c.cross_attention_dim.at(0),
           shape_str(encoder_hidden_states.sizes()));
  SD_CHECK(encoder_hidden_states.scalar_type() == sample_in.scalar_type(),
           "UNet: encoder_hidden_states dtype {} differs from the model's {}",
           c10::toString(encoder_hidden_states.scalar_type()), c10::toString(sample_in.scalar_type()));
  SD_CHECK(timestep.defined() &&
               (timestep.dim() == 0 || (timestep.dim() == 1 && (timestep.size(0) == batch || timestep.size(0) == 1))),
           "UNet: timestep must be a scalar or have {} (or 1) entries", batch);

  // When H or W is not a multiple of the total upscale, each upsampler is told the size of its skip tensors.
  const int64_t up_factor = int64_t{1} << (c.num_blocks() - 1);
  const bool forward_upsample_size = sample_in.size(2) % up_factor != 0 || sample_in.size(3) % up_factor != 0;

  at::Tensor sample = c.center_input_sample ? 2 * sample_in - 1.0 : sample_in;

  // time: sinusoidal embedding in float32 whatever the model dtype, then the model's dtype.
  at::Tensor t = timestep.dim() == 0 ? timestep.unsqueeze(0) : timestep;
  t = t.to(sample.device()).expand({batch});
  at::Tensor t_emb = timestep_embedding(t, c.block_out_channels[0], c.flip_sin_to_cos, c.freq_shift);
  at::Tensor emb = time_embedding->forward(t_emb.to(sample.scalar_type()));  // [N, T]

  sample = conv_in->forward(sample);
  std::vector<at::Tensor> skips{sample};
  for (size_t i = 0; i < down_.size(); ++i) {
    auto res = run_down(i, sample, emb, encoder_hidden_states);
    sample = res.back();
    skips.insert(skips.end(), res.begin(), res.end());
  }

  if (mid_block) sample = run_mid(sample, emb, encoder_hidden_states);

  std::optional<std::vector<int64_t>> upsample_size;
  for (size_t i = 0; i < up_.size(); ++i) {
    const size_t take = static_cast<size_t>(up_[i]->num_layers());
    std::vector<at::Tensor> block_skips(skips.end() - take, skips.end());
    skips.resize(skips.size() - take);
    if (i + 1 < up_.size() && forward_upsample_size)
      upsample_size = std::vector<int64_t>{skips.back().size(2), skips.back().size(3)};
    sample = run_up(i, sample, block_skips, emb, encoder_hidden_states, upsample_size);
  }

  sample = activate(act_, group_norm(conv_norm_out, sample));
  return conv_out->forward(sample);
}

// ---------------------------------------------------------------------------------------------------------------

UNet2DConditionModel load_unet(const std::filesystem::path& dir, at::ScalarType dtype, const std::string& variant) {
  UNetConfig config = UNetConfig::load((dir / "config.json").string());
  return load_unet(std::move(config), *open_weights(dir, WeightFileNames::diffusers(), variant), dtype);
}

UNet2DConditionModel load_unet(UNetConfig config, const io::TensorFile& weights, at::ScalarType dtype) {
  SD_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kDouble,
           "load_unet: dtype must be float32, bfloat16 or float64, got {}", c10::toString(dtype));
  UNet2DConditionModel model = [&] {
    ScopedDefaultDtype built_in(dtype);
    ScopedUninitializedLayers weights_read_next;
    return UNet2DConditionModel(std::move(config));
  }();
  load_weights(*model, weights);
  return model;
}

// ---------------------------------------------------------------------------------------------------------------

namespace {

// Parameter counts of the building blocks, mirroring their constructors.
int64_t conv(int64_t in, int64_t out, int64_t k) { return in * out * k * k + out; }
int64_t linear(int64_t in, int64_t out, bool bias = true) { return in * out + (bias ? out : 0); }
int64_t norm(int64_t channels) { return 2 * channels; }

int64_t resnet(int64_t in, int64_t out, int64_t temb) {
  return norm(in) + conv(in, out, 3) + (temb > 0 ? linear(temb, out) : 0) + norm(out) + conv(out, out, 3) +
         (in != out ? conv(in, out, 1) : 0);
}

int64_t attention(int64_t query_dim, int64_t context_dim, int64_t inner) {
  return linear(query_dim, inner, false) + 2 * linear(context_dim, inner, false) + linear(inner, query_dim);
}

int64_t transformer(int64_t channels, int64_t heads, int64_t layers, int64_t context_dim) {
  const int64_t inner = heads * (channels / heads);
  const int64_t block = 3 * norm(inner) + attention(inner, inner, inner) + attention(inner, context_dim, inner) +
                        linear(inner, 4 * inner * 2) + linear(4 * inner, inner);
  // proj_in/proj_out: a 1×1 conv and a Linear have the same parameter count.
  return norm(channels) + linear(channels, inner) + layers * block + linear(inner, channels);
}

// Forward FLOPs of the same blocks over `pixels` positions (2 per multiply-add).
int64_t conv_flops(int64_t in, int64_t out, int64_t k, int64_t pixels) { return 2 * in * out * k * k * pixels; }
int64_t linear_flops(int64_t in, int64_t out, int64_t tokens) { return 2 * in * out * tokens; }

int64_t resnet_flops(int64_t in, int64_t out, int64_t temb, int64_t pixels) {
  return conv_flops(in, out, 3, pixels) + linear_flops(temb, out, 1) + conv_flops(out, out, 3, pixels) +
         (in != out ? conv_flops(in, out, 1, pixels) : 0);
}

int64_t attention_flops(int64_t query_dim, int64_t context_dim, int64_t inner, int64_t tokens, int64_t context) {
  return linear_flops(query_dim, inner, tokens) + 2 * linear_flops(context_dim, inner, context) +
         2 * 2 * tokens * context * inner + linear_flops(inner, query_dim, tokens);
}

int64_t transformer_flops(int64_t channels, int64_t heads, int64_t layers, int64_t context_dim, int64_t pixels,
                          int64_t context) {
  const int64_t inner = heads * (channels / heads);
  const int64_t block = attention_flops(inner, inner, inner, pixels, pixels) +
                        attention_flops(inner, context_dim, inner, pixels, context) +
                        linear_flops(inner, 4 * inner * 2, pixels) + linear_flops(4 * inner, inner, pixels);
  return linear_flops(channels, inner, pixels) + layers * block + linear_flops(inner, channels, pixels);
}

// One layer of the UNet as count_parameters and count_forward_flops see it. `level` is its resolution level: how many
// downsamplers run before it, which is also the index of the block it belongs to (a transformer works on that
// block's width). A resnet takes `in` channels to `out`.
struct CountedLayer {
  enum Kind { kConv, kLinear, kNorm, kResnet, kTransformer } kind;
  int64_t in = 0, out = 0, kernel = 0;
  size_t level = 0;
};

// Calls visit(CountedLayer) for every layer with parameters or FLOPs, in the order diffusers' UNet2DConditionModel
// builds them: conv_in, the time embedding, the down blocks (resnets, transformers, downsamplers), the mid block, the
// up blocks (resnets on the skip-concatenated channels, transformers, upsamplers), conv_norm_out and conv_out.
template <typename Visit>
void for_each_counted_layer(const UNetConfig& c, const Visit& visit) {
  const size_t n = c.num_blocks();
  const auto& ch = c.block_out_channels;
  const int64_t t = c.time_embed_dim();
  using L = CountedLayer;
  visit(L{L::kConv, c.in_channels, ch[0], c.conv_in_kernel, 0});
  visit(L{L::kLinear, ch[0], t});
  visit(L{L::kLinear, t, t});
  int64_t out = ch[0];
  for (size_t i = 0; i < n; ++i) {
    const int64_t in = out;
    out = ch[i];
    for (int64_t l = 0; l < c.layers_per_block.at(i); ++l) {
      visit(L{L::kResnet, l == 0 ? in : out, out, 0, i});
      if (c.down_block_types[i] == "CrossAttnDownBlock2D") visit(L{L::kTransformer, 0, 0, 0, i});
    }
    if (i + 1 < n) visit(L{L::kConv, out, out, 3, i + 1});
  }
  if (c.mid_block_type) {
    visit(L{L::kResnet, ch[n - 1], ch[n - 1], 0, n - 1});
    visit(L{L::kResnet, ch[n - 1], ch[n - 1], 0, n - 1});
    visit(L{L::kTransformer, 0, 0, 0, n - 1});
  }
  out = ch[n - 1];
  for (size_t i = 0; i < n; ++i) {
    const size_t m = n - 1 - i;
    const int64_t prev = out;
    out = ch[m];
    const int64_t skip = ch[m == 0 ? 0 : m - 1];
    const int64_t layers = c.layers_per_block.at(m) + 1;
    for (int64_t l = 0; l < layers; ++l) {
      visit(L{L::kResnet, (l == 0 ? prev : out) + (l == layers - 1 ? skip : out), out, 0, m});
      if (c.up_block_types[i] == "CrossAttnUpBlock2D") visit(L{L::kTransformer, 0, 0, 0, m});
    }
    if (i + 1 < n) visit(L{L::kConv, out, out, 3, m - 1});
  }
  visit(L{L::kNorm, ch[0], ch[0]});
  visit(L{L::kConv, ch[0], c.out_channels, c.conv_out_kernel, 0});
}

}  // namespace

int64_t count_forward_flops(const UNetConfig& c, int64_t batch, int64_t height, int64_t width, int64_t context_length) {
  c.validate();
  const int64_t t = c.time_embed_dim();
  // Positions at a resolution level: halved by every downsampler before it.
  auto pixels = [&](size_t level) {
    return ((height + (1 << level) - 1) >> level) * ((width + (1 << level) - 1) >> level);
  };
  int64_t total = 0;
  for_each_counted_layer(c, [&](const CountedLayer& l) {
    switch (l.kind) {
      case CountedLayer::kConv: total += conv_flops(l.in, l.out, l.kernel, pixels(l.level)); break;
      case CountedLayer::kLinear: total += linear_flops(l.in, l.out, 1); break;  // the time embedding: one token
      case CountedLayer::kNorm: break;
      case CountedLayer::kResnet: total += resnet_flops(l.in, l.out, t, pixels(l.level)); break;
      case CountedLayer::kTransformer:
        total += transformer_flops(c.block_out_channels[l.level], c.heads(l.level),
                                   c.transformer_layers_per_block.at(l.level), c.cross_attention_dim.at(l.level),
                                   pixels(l.level), context_length);
        break;
    }
  });
  return batch * total;
}

int64_t count_parameters(const UNetConfig& c) {
  c.validate();
  const int64_t t = c.time_embed_dim();
  int64_t total = 0;
  for_each_counted_layer(c, [&](const CountedLayer& l) {
    switch (l.kind) {
      case CountedLayer::kConv: total += conv(l.in, l.out, l.kernel); break;
      case CountedLayer::kLinear: total += linear(l.in, l.out); break;
      case CountedLayer::kNorm: total += norm(l.in); break;
      case CountedLayer::kResnet: total += resnet(l.in, l.out, t); break;
      case CountedLayer::kTransformer:
        total += transformer(c.block_out_channels[l.level], c.heads(l.level),
                             c.transformer_layers_per_block.at(l.level), c.cross_attention_dim.at(l.level));
        break;
    }
  });
  return total;
}

}  // namespace sd::models
