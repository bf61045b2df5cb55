#include "models/unet/unet_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <tuple>

#include "core/error.h"
#include "models/diffusers_blocks.h"

namespace sd::models {

using nlohmann::json;

std::vector<int64_t> PerBlockInt::expand(size_t n) const {
  if (is_list) return values;
  return std::vector<int64_t>(n, values.at(0));
}

json PerBlockInt::to_json() const { return is_list ? json(values) : json(values.at(0)); }

namespace {

PerBlockInt per_block_int(const io::JsonConfig& cfg, const std::string& key, PerBlockInt fallback) {
  if (!cfg.has(key)) return fallback;
  const json& v = cfg.raw()[key];
  if (v.is_number_integer()) return PerBlockInt::scalar(cfg.get<int64_t>(key, 0));
  if (v.is_array()) {
    for (const auto& e : v)
      if (!e.is_number_integer()) cfg.fail_key(key, "an integer or a list of integers");
    return PerBlockInt::list(cfg.get<std::vector<int64_t>>(key, {}));
  }
  cfg.fail_key(key, "an integer or a list of integers");
}

template <typename T>
json optional_json(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

// Python writes 1 for an int default and 1.0 for a float one; keep integral values integral so a saved config
// reads like diffusers' own.
json number_json(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) return json(static_cast<int64_t>(v));
  return json(v);
}

}  // namespace

UNetConfig UNetConfig::from_json(const io::JsonConfig& cfg) {
  UNetConfig c;
  c.source = cfg.source();
  const std::string class_name = cfg.get<std::string>("_class_name", "UNet2DConditionModel");
  SD_CHECK(class_name == "UNet2DConditionModel", "{}: key '_class_name' is \"{}\", expected UNet2DConditionModel",
           cfg.source(), class_name);
  c.sample_size = cfg.get_optional<int64_t>("sample_size");
  c.in_channels = cfg.get<int64_t>("in_channels", c.in_channels);
  c.out_channels = cfg.get<int64_t>("out_channels", c.out_channels);
  c.center_input_sample = cfg.get<bool>("center_input_sample", c.center_input_sample);
  c.flip_sin_to_cos = cfg.get<bool>("flip_sin_to_cos", c.flip_sin_to_cos);
  c.freq_shift = cfg.get<int64_t>("freq_shift", c.freq_shift);
  c.down_block_types = cfg.get<std::vector<std::string>>("down_block_types", c.down_block_types);
  // mid_block_type: null means "no mid block" in diffusers, so a present null differs from a missing key.
  if (cfg.raw().contains("mid_block_type")) c.mid_block_type = cfg.get_optional<std::string>("mid_block_type");
  c.up_block_types = cfg.get<std::vector<std::string>>("up_block_types", c.up_block_types);
  if (cfg.has("only_cross_attention")) {
    const json& v = cfg.raw()["only_cross_attention"];
    bool ok = v.is_boolean();
    if (v.is_array()) {
      ok = true;
      for (const auto& e : v) ok = ok && e.is_boolean();
    }
    if (!ok) cfg.fail_key("only_cross_attention", "true, false or a list of them");
    c.only_cross_attention = v;
  }
  c.block_out_channels = cfg.get<std::vector<int64_t>>("block_out_channels", c.block_out_channels);
  c.layers_per_block = per_block_int(cfg, "layers_per_block", c.layers_per_block);
  c.downsample_padding = cfg.get<int64_t>("downsample_padding", c.downsample_padding);
  c.mid_block_scale_factor = cfg.get<double>("mid_block_scale_factor", c.mid_block_scale_factor);
  c.dropout = cfg.get<double>("dropout", c.dropout);
  c.act_fn = cfg.get<std::string>("act_fn", c.act_fn);
  if (cfg.raw().contains("norm_num_groups")) c.norm_num_groups = cfg.get_optional<int64_t>("norm_num_groups");
  c.norm_eps = cfg.get<double>("norm_eps", c.norm_eps);
  c.cross_attention_dim = per_block_int(cfg, "cross_attention_dim", c.cross_attention_dim);
  if (cfg.has("transformer_layers_per_block")) {
    const json& v = cfg.raw()["transformer_layers_per_block"];
    bool nested = v.is_array() && !v.empty() && v[0].is_array();
    if (nested)
      fail("{}: key 'transformer_layers_per_block' as a list of lists (per-layer counts) is not supported",
           cfg.source());
    c.transformer_layers_per_block = per_block_int(cfg, "transformer_layers_per_block", c.transformer_layers_per_block);
  }
  if (cfg.has("reverse_transformer_layers_per_block"))
    c.reverse_transformer_layers_per_block = cfg.raw()["reverse_transformer_layers_per_block"];
  c.encoder_hid_dim = cfg.get_optional<int64_t>("encoder_hid_dim");
  c.encoder_hid_dim_type = cfg.get_optional<std::string>("encoder_hid_dim_type");
  c.attention_head_dim = per_block_int(cfg, "attention_head_dim", c.attention_head_dim);
  if (cfg.has("num_attention_heads"))
    c.num_attention_heads = per_block_int(cfg, "num_attention_heads", PerBlockInt::scalar(0));
  c.dual_cross_attention = cfg.get<bool>("dual_cross_attention", c.dual_cross_attention);
  c.use_linear_projection = cfg.get<bool>("use_linear_projection", c.use_linear_projection);
  c.class_embed_type = cfg.get_optional<std::string>("class_embed_type");
  c.addition_embed_type = cfg.get_optional<std::string>("addition_embed_type");
  c.addition_time_embed_dim = cfg.get_optional<int64_t>("addition_time_embed_dim");
  c.num_class_embeds = cfg.get_optional<int64_t>("num_class_embeds");
  c.upcast_attention = cfg.get<bool>("upcast_attention", c.upcast_attention);
  c.resnet_time_scale_shift = cfg.get<std::string>("resnet_time_scale_shift", c.resnet_time_scale_shift);
  c.resnet_skip_time_act = cfg.get<bool>("resnet_skip_time_act", c.resnet_skip_time_act);
  c.resnet_out_scale_factor = cfg.get<double>("resnet_out_scale_factor", c.resnet_out_scale_factor);
  c.time_embedding_type = cfg.get<std::string>("time_embedding_type", c.time_embedding_type);
  c.time_embedding_dim = cfg.get_optional<int64_t>("time_embedding_dim");
  c.time_embedding_act_fn = cfg.get_optional<std::string>("time_embedding_act_fn");
  c.timestep_post_act = cfg.get_optional<std::string>("timestep_post_act");
  c.time_cond_proj_dim = cfg.get_optional<int64_t>("time_cond_proj_dim");
  c.conv_in_kernel = cfg.get<int64_t>("conv_in_kernel", c.conv_in_kernel);
  c.conv_out_kernel = cfg.get<int64_t>("conv_out_kernel", c.conv_out_kernel);
  c.projection_class_embeddings_input_dim = cfg.get_optional<int64_t>("projection_class_embeddings_input_dim");
  c.attention_type = cfg.get<std::string>("attention_type", c.attention_type);
  c.class_embeddings_concat = cfg.get<bool>("class_embeddings_concat", c.class_embeddings_concat);
  c.mid_block_only_cross_attention = cfg.get_optional<bool>("mid_block_only_cross_attention");
  c.cross_attention_norm = cfg.get_optional<std::string>("cross_attention_norm");
  c.addition_embed_type_num_heads = cfg.get<int64_t>("addition_embed_type_num_heads", c.addition_embed_type_num_heads);
  c.validate();
  return c;
}

UNetConfig UNetConfig::load(const std::string& path) { return from_json(io::JsonConfig::load(path)); }

json UNetConfig::to_json() const {
  json j = json::object();
  j["_class_name"] = "UNet2DConditionModel";
  j["_diffusers_version"] = "0.24.0";
  j["act_fn"] = act_fn;
  j["addition_embed_type"] = optional_json(addition_embed_type);
  j["addition_embed_type_num_heads"] = addition_embed_type_num_heads;
  j["addition_time_embed_dim"] = optional_json(addition_time_embed_dim);
  j["attention_head_dim"] = attention_head_dim.to_json();
  j["attention_type"] = attention_type;
  j["block_out_channels"] = block_out_channels;
  j["center_input_sample"] = center_input_sample;
  j["class_embed_type"] = optional_json(class_embed_type);
  j["class_embeddings_concat"] = class_embeddings_concat;
  j["conv_in_kernel"] = conv_in_kernel;
  j["conv_out_kernel"] = conv_out_kernel;
  j["cross_attention_dim"] = cross_attention_dim.to_json();
  j["cross_attention_norm"] = optional_json(cross_attention_norm);
  j["down_block_types"] = down_block_types;
  j["downsample_padding"] = downsample_padding;
  j["dropout"] = dropout;
  j["dual_cross_attention"] = dual_cross_attention;
  j["encoder_hid_dim"] = optional_json(encoder_hid_dim);
  j["encoder_hid_dim_type"] = optional_json(encoder_hid_dim_type);
  j["flip_sin_to_cos"] = flip_sin_to_cos;
  j["freq_shift"] = freq_shift;
  j["in_channels"] = in_channels;
  j["layers_per_block"] = layers_per_block.to_json();
  j["mid_block_only_cross_attention"] = optional_json(mid_block_only_cross_attention);
  j["mid_block_scale_factor"] = number_json(mid_block_scale_factor);
  j["mid_block_type"] = optional_json(mid_block_type);
  j["norm_eps"] = norm_eps;
  j["norm_num_groups"] = optional_json(norm_num_groups);
  j["num_attention_heads"] = num_attention_heads ? num_attention_heads->to_json() : json(nullptr);
  j["num_class_embeds"] = optional_json(num_class_embeds);
  j["only_cross_attention"] = only_cross_attention;
  j["out_channels"] = out_channels;
  j["projection_class_embeddings_input_dim"] = optional_json(projection_class_embeddings_input_dim);
  j["resnet_out_scale_factor"] = resnet_out_scale_factor;
  j["resnet_skip_time_act"] = resnet_skip_time_act;
  j["resnet_time_scale_shift"] = resnet_time_scale_shift;
  j["reverse_transformer_layers_per_block"] = reverse_transformer_layers_per_block;
  j["sample_size"] = optional_json(sample_size);
  j["time_cond_proj_dim"] = optional_json(time_cond_proj_dim);
  j["time_embedding_act_fn"] = optional_json(time_embedding_act_fn);
  j["time_embedding_dim"] = optional_json(time_embedding_dim);
  j["time_embedding_type"] = time_embedding_type;
  j["timestep_post_act"] = optional_json(timestep_post_act);
  j["transformer_layers_per_block"] = transformer_layers_per_block.to_json();
  j["up_block_types"] = up_block_types;
  j["upcast_attention"] = upcast_attention;
  j["use_linear_projection"] = use_linear_projection;
  return j;
}

void UNetConfig::validate() const {
  const std::string& src = source;
  auto unsupported = [&](const std::string& key, const std::string& value) {
    fail("{}: key '{}' = {} is not supported (sdtrain implements the SD-1.x/SD-2.x UNet)", src, key, value);
  };
  const size_t n = num_blocks();
  SD_CHECK(n >= 1, "{}: key 'block_out_channels' must not be empty", src);
  // Upper bounds a few times those of the largest SD-family UNets (SDXL: 3 blocks, 1280 channels, 10 transformer
  // layers; SD: 2 resnets per block, 8 or 20 heads), before any weight is allocated.
  io::check_at_most(src, "block_out_channels (entries)", static_cast<int64_t>(n), 6);
  for (auto ch : block_out_channels) {
    SD_CHECK(ch > 0, "{}: key 'block_out_channels' must be positive", src);
    io::check_at_most(src, "block_out_channels", ch, 4096);
  }
  for (const auto& [key, v, limit] : {std::tuple{"layers_per_block", &layers_per_block, 8},
                                      std::tuple{"transformer_layers_per_block", &transformer_layers_per_block, 16},
                                      std::tuple{"cross_attention_dim", &cross_attention_dim, 8192},
                                      std::tuple{"attention_head_dim", &attention_head_dim, 1024}})
    for (auto x : v->values) io::check_at_most(src, key, x, limit);
  io::check_at_most(src, "in_channels", in_channels, 256);
  io::check_at_most(src, "out_channels", out_channels, 256);
  io::check_at_most(src, "conv_in_kernel", conv_in_kernel, 15);
  io::check_at_most(src, "conv_out_kernel", conv_out_kernel, 15);
  io::check_at_most(src, "downsample_padding", downsample_padding, 15);
  if (time_embedding_dim) io::check_at_most(src, "time_embedding_dim", *time_embedding_dim, 16384);
  if (sample_size) {
    SD_CHECK(*sample_size >= 1, "{}: key 'sample_size' must be >= 1, got {}", src, *sample_size);
    io::check_at_most(src, "sample_size", *sample_size, 4096);
  }
  SD_CHECK(down_block_types.size() == n, "{}: key 'down_block_types' has {} entries but block_out_channels has {}", src,
           down_block_types.size(), n);
  SD_CHECK(up_block_types.size() == n, "{}: key 'up_block_types' has {} entries but down_block_types has {}", src,
           up_block_types.size(), n);
  for (const auto& t : down_block_types)
    if (t != "CrossAttnDownBlock2D" && t != "DownBlock2D")
      fail("{}: key 'down_block_types' has unsupported block \"{}\" (expected CrossAttnDownBlock2D or DownBlock2D)",
           src, t);
  for (const auto& t : up_block_types)
    if (t != "CrossAttnUpBlock2D" && t != "UpBlock2D")
      fail("{}: key 'up_block_types' has unsupported block \"{}\" (expected CrossAttnUpBlock2D or UpBlock2D)", src, t);
  if (mid_block_type && *mid_block_type != "UNetMidBlock2DCrossAttn")
    fail("{}: key 'mid_block_type' has unsupported block \"{}\" (expected UNetMidBlock2DCrossAttn or null)", src,
         *mid_block_type);

  auto check_per_block = [&](const PerBlockInt& v, const std::string& key, bool positive) {
    if (v.is_list)
      SD_CHECK(v.values.size() == n, "{}: key '{}' has {} entries but there are {} blocks", src, key, v.values.size(),
               n);
    for (auto x : v.values) SD_CHECK(!positive || x > 0, "{}: key '{}' must be positive, got {}", src, key, x);
  };
  check_per_block(layers_per_block, "layers_per_block", true);
  check_per_block(cross_attention_dim, "cross_attention_dim", true);
  check_per_block(transformer_layers_per_block, "transformer_layers_per_block", true);
  check_per_block(attention_head_dim, "attention_head_dim", true);
  // diffusers 0.24 itself refuses num_attention_heads for this class (the naming issue #2011).
  if (num_attention_heads) unsupported("num_attention_heads", num_attention_heads->to_json().dump());

  parse_activation(act_fn, src + ": key 'act_fn'");
  SD_CHECK(norm_num_groups.has_value(), "{}: key 'norm_num_groups' = null is not supported", src);
  SD_CHECK(*norm_num_groups > 0, "{}: key 'norm_num_groups' must be positive", src);
  for (size_t i = 0; i < n; ++i) {
    SD_CHECK(block_out_channels[i] % *norm_num_groups == 0,
             "{}: key 'norm_num_groups' ({}) must divide every entry of block_out_channels, got {}", src,
             *norm_num_groups, block_out_channels[i]);
    const bool has_attention = down_block_types[i] == "CrossAttnDownBlock2D" ||
                               up_block_types[n - 1 - i] == "CrossAttnUpBlock2D" || (i == n - 1 && mid_block_type);
    if (has_attention)
      SD_CHECK(block_out_channels[i] % heads(i) == 0,
               "{}: key 'attention_head_dim' ({} heads) does not divide block_out_channels entry {}", src, heads(i),
               block_out_channels[i]);
  }
  SD_CHECK(norm_eps > 0, "{}: key 'norm_eps' must be positive", src);
  SD_CHECK(in_channels > 0 && out_channels > 0, "{}: keys 'in_channels'/'out_channels' must be positive", src);
  SD_CHECK(conv_in_kernel > 0 && conv_in_kernel % 2 == 1, "{}: key 'conv_in_kernel' must be odd", src);
  SD_CHECK(conv_out_kernel > 0 && conv_out_kernel % 2 == 1, "{}: key 'conv_out_kernel' must be odd", src);
  SD_CHECK(downsample_padding >= 0, "{}: key 'downsample_padding' must be >= 0", src);
  if (time_embedding_dim) SD_CHECK(*time_embedding_dim > 0, "{}: key 'time_embedding_dim' must be positive", src);

  // Everything below is a feature of other diffusers UNets (SDXL, Kandinsky, DeepFloyd, LCM, ...).
  bool any_cross_only = only_cross_attention.is_boolean() ? only_cross_attention.get<bool>() : false;
  if (only_cross_attention.is_array())
    for (const auto& e : only_cross_attention) any_cross_only = any_cross_only || e.get<bool>();
  if (any_cross_only) unsupported("only_cross_attention", only_cross_attention.dump());
  if (dropout != 0.0) unsupported("dropout", fmt::format("{}", dropout));
  if (resnet_time_scale_shift != "default")
    unsupported("resnet_time_scale_shift", "\"" + resnet_time_scale_shift + "\"");
  if (time_embedding_type != "positional") unsupported("time_embedding_type", "\"" + time_embedding_type + "\"");
  if (time_embedding_act_fn) unsupported("time_embedding_act_fn", "\"" + *time_embedding_act_fn + "\"");
  if (timestep_post_act) unsupported("timestep_post_act", "\"" + *timestep_post_act + "\"");
  if (time_cond_proj_dim) unsupported("time_cond_proj_dim", std::to_string(*time_cond_proj_dim));
  if (class_embed_type) unsupported("class_embed_type", "\"" + *class_embed_type + "\"");
  if (num_class_embeds) unsupported("num_class_embeds", std::to_string(*num_class_embeds));
  if (addition_embed_type) unsupported("addition_embed_type", "\"" + *addition_embed_type + "\"");
  if (encoder_hid_dim) unsupported("encoder_hid_dim", std::to_string(*encoder_hid_dim));
  if (encoder_hid_dim_type) unsupported("encoder_hid_dim_type", "\"" + *encoder_hid_dim_type + "\"");
  if (dual_cross_attention) unsupported("dual_cross_attention", "true");
  if (attention_type != "default") unsupported("attention_type", "\"" + attention_type + "\"");
  if (cross_attention_norm) unsupported("cross_attention_norm", "\"" + *cross_attention_norm + "\"");
  if (!reverse_transformer_layers_per_block.is_null())
    unsupported("reverse_transformer_layers_per_block", reverse_transformer_layers_per_block.dump());
}

UNetConfig UNetConfig::sd15() {
  UNetConfig c;
  c.source = "UNetConfig::sd15";
  c.sample_size = 64;
  c.attention_head_dim = PerBlockInt::scalar(8);
  c.cross_attention_dim = PerBlockInt::scalar(768);
  return c;
}

UNetConfig UNetConfig::sd2_base() {
  UNetConfig c;
  c.source = "UNetConfig::sd2_base";
  c.sample_size = 64;
  c.attention_head_dim = PerBlockInt::list({5, 10, 20, 20});
  c.cross_attention_dim = PerBlockInt::scalar(1024);
  c.use_linear_projection = true;
  return c;
}

UNetConfig UNetConfig::sd2() {
  UNetConfig c = sd2_base();
  c.source = "UNetConfig::sd2";
  c.sample_size = 96;
  return c;
}

}  // namespace sd::models
