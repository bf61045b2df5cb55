#include "models/vae/vae_config.h"

#include "core/error.h"
#include "models/diffusers_blocks.h"

namespace sd::models {

using nlohmann::json;

VaeConfig VaeConfig::from_json(const io::JsonConfig& cfg) {
  VaeConfig c;
  c.source = cfg.source();
  const std::string class_name = cfg.get<std::string>("_class_name", "AutoencoderKL");
  SD_CHECK(class_name == "AutoencoderKL", "{}: key '_class_name' is \"{}\", expected AutoencoderKL", cfg.source(),
           class_name);
  c.in_channels = cfg.get<int64_t>("in_channels", c.in_channels);
  c.out_channels = cfg.get<int64_t>("out_channels", c.out_channels);
  c.down_block_types = cfg.get<std::vector<std::string>>("down_block_types", c.down_block_types);
  c.up_block_types = cfg.get<std::vector<std::string>>("up_block_types", c.up_block_types);
  c.block_out_channels = cfg.get<std::vector<int64_t>>("block_out_channels", c.block_out_channels);
  c.layers_per_block = cfg.get<int64_t>("layers_per_block", c.layers_per_block);
  c.act_fn = cfg.get<std::string>("act_fn", c.act_fn);
  c.latent_channels = cfg.get<int64_t>("latent_channels", c.latent_channels);
  c.norm_num_groups = cfg.get<int64_t>("norm_num_groups", c.norm_num_groups);
  c.sample_size = cfg.get<int64_t>("sample_size", c.sample_size);
  c.scaling_factor = cfg.get<double>("scaling_factor", c.scaling_factor);
  c.force_upcast = cfg.get<bool>("force_upcast", c.force_upcast);
  c.validate();
  return c;
}

VaeConfig VaeConfig::load(const std::string& path) { return from_json(io::JsonConfig::load(path)); }

json VaeConfig::to_json() const {
  json j = json::object();
  j["_class_name"] = "AutoencoderKL";
  j["_diffusers_version"] = "0.24.0";
  j["act_fn"] = act_fn;
  j["block_out_channels"] = block_out_channels;
  j["down_block_types"] = down_block_types;
  j["force_upcast"] = force_upcast;
  j["in_channels"] = in_channels;
  j["latent_channels"] = latent_channels;
  j["layers_per_block"] = layers_per_block;
  j["norm_num_groups"] = norm_num_groups;
  j["out_channels"] = out_channels;
  j["sample_size"] = sample_size;
  j["scaling_factor"] = scaling_factor;
  j["up_block_types"] = up_block_types;
  return j;
}

void VaeConfig::validate() const {
  const std::string& src = source;
  const size_t n = block_out_channels.size();
  SD_CHECK(n >= 1, "{}: key 'block_out_channels' must not be empty", src);
  // A few times SD's VAE (4 blocks of up to 512 channels, 2 resnets each), before any weight is allocated.
  io::check_at_most(src, "block_out_channels (entries)", static_cast<int64_t>(n), 6);
  for (auto ch : block_out_channels) io::check_at_most(src, "block_out_channels", ch, 4096);
  io::check_at_most(src, "layers_per_block", layers_per_block, 8);
  io::check_at_most(src, "in_channels", in_channels, 256);
  io::check_at_most(src, "out_channels", out_channels, 256);
  io::check_at_most(src, "latent_channels", latent_channels, 256);
  io::check_at_most(src, "sample_size", sample_size, 16384);
  SD_CHECK(down_block_types.size() == n, "{}: key 'down_block_types' has {} entries but block_out_channels has {}", src,
           down_block_types.size(), n);
  SD_CHECK(up_block_types.size() == n, "{}: key 'up_block_types' has {} entries but block_out_channels has {}", src,
           up_block_types.size(), n);
  for (const auto& t : down_block_types)
    SD_CHECK(t == "DownEncoderBlock2D",
             "{}: key 'down_block_types' has unsupported block \"{}\" (expected "
             "DownEncoderBlock2D)",
             src, t);
  for (const auto& t : up_block_types)
    SD_CHECK(t == "UpDecoderBlock2D",
             "{}: key 'up_block_types' has unsupported block \"{}\" (expected "
             "UpDecoderBlock2D)",
             src, t);
  SD_CHECK(norm_num_groups > 0, "{}: key 'norm_num_groups' must be positive", src);
  for (auto ch : block_out_channels)
    SD_CHECK(ch > 0 && ch % norm_num_groups == 0,
             "{}: key 'norm_num_groups' ({}) must divide every positive entry of block_out_channels, got {}", src,
             norm_num_groups, ch);
  SD_CHECK(layers_per_block >= 1, "{}: key 'layers_per_block' must be >= 1", src);
  SD_CHECK(in_channels > 0 && out_channels > 0 && latent_channels > 0,
           "{}: keys 'in_channels', 'out_channels', 'latent_channels' must be positive", src);
  SD_CHECK(scaling_factor > 0, "{}: key 'scaling_factor' must be positive", src);
  parse_activation(act_fn, src + ": key 'act_fn'");
}

VaeConfig VaeConfig::sd() {
  VaeConfig c;
  c.source = "VaeConfig::sd";
  c.down_block_types.assign(4, "DownEncoderBlock2D");
  c.up_block_types.assign(4, "UpDecoderBlock2D");
  c.block_out_channels = {128, 256, 512, 512};
  c.layers_per_block = 2;
  c.sample_size = 512;
  return c;
}

}  // namespace sd::models
