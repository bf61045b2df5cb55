#include "models/name_conversion.h"

#include <fmt/format.h>

#include "core/error.h"

namespace sd::models {

namespace {

constexpr const char* kUnetPrefix = "model.diffusion_model.";
constexpr const char* kVaePrefix = "first_stage_model.";
constexpr const char* kOpenAiClipPrefix = "cond_stage_model.transformer.";
constexpr const char* kOpenClipPrefix = "cond_stage_model.model.";

// A pattern ending in '.' (or empty) matches every name it starts; any other pattern matches only itself.
bool matches(const std::string& pattern, const std::string& name) {
  if (pattern.empty() || pattern.back() == '.') return name.compare(0, pattern.size(), pattern) == 0;
  return name == pattern;
}

}  // namespace

const char* component_folder(Component component) {
  switch (component) {
    case Component::kUnet: return "unet";
    case Component::kVae: return "vae";
    case Component::kTextEncoder: return "text_encoder";
  }
  return "?";
}

TextEncoderLayout text_encoder_layout(const ClipTextConfig& config) {
  return config.hidden_act == "gelu" ? TextEncoderLayout::kOpenClip : TextEncoderLayout::kOpenAiClip;
}

const char* describe(TextEncoderLayout layout) {
  return layout == TextEncoderLayout::kOpenClip ? "SD-2 (OpenCLIP)" : "SD-1 (OpenAI CLIP)";
}

LdmNames::LdmNames(const UNetConfig& unet, const VaeConfig& vae, const ClipTextConfig& text_encoder)
    : text_layout_(models::text_encoder_layout(text_encoder)) {
  add_unet(unet);
  add_vae(vae);
  add_text_encoder(text_encoder);
}

void LdmNames::add(Component component, std::string ldm, std::string diffusers, const std::vector<Leaf>* leaves) {
  modules_.push_back({component, std::move(ldm), std::move(diffusers), leaves});
}

void LdmNames::add_older_spelling(Component component, std::string ldm, std::string diffusers) {
  modules_.push_back({component, std::move(ldm), std::move(diffusers), nullptr, /*read_only=*/true});
}

// The LDM UNet numbers its blocks in one sequence: input_blocks (conv_in, then each level's resnet+attention pairs
// and its downsampler), middle_block, output_blocks (each level's layers, the last one holding the upsampler).
void LdmNames::add_unet(const UNetConfig& config) {
  static const std::vector<Leaf> resnet = {{"in_layers.0.", "norm1."},          {"in_layers.2.", "conv1."},
                                           {"out_layers.0.", "norm2."},         {"out_layers.3.", "conv2."},
                                           {"emb_layers.1.", "time_emb_proj."}, {"skip_connection.", "conv_shortcut."}};
  const auto unet = [&](const std::string& ldm, const std::string& diffusers, const std::vector<Leaf>* leaves) {
    add(Component::kUnet, kUnetPrefix + ldm, diffusers, leaves);
  };
  unet("time_embed.0.", "time_embedding.linear_1.", nullptr);
  unet("time_embed.2.", "time_embedding.linear_2.", nullptr);
  unet("input_blocks.0.0.", "conv_in.", nullptr);
  unet("out.0.", "conv_norm_out.", nullptr);
  unet("out.2.", "conv_out.", nullptr);

  const size_t levels = config.num_blocks();
  const std::vector<int64_t> layers = config.layers_per_block.expand(levels);
  int input = 1;
  for (size_t i = 0; i < levels; ++i) {
    const bool attention = config.down_block_types[i] == "CrossAttnDownBlock2D";
    for (int64_t j = 0; j < layers[i]; ++j, ++input) {
      unet(fmt::format("input_blocks.{}.0.", input), fmt::format("down_blocks.{}.resnets.{}.", i, j), &resnet);
      if (attention)
        unet(fmt::format("input_blocks.{}.1.", input), fmt::format("down_blocks.{}.attentions.{}.", i, j), nullptr);
    }
    if (i + 1 < levels)
      unet(fmt::format("input_blocks.{}.0.op.", input++), fmt::format("down_blocks.{}.downsamplers.0.conv.", i),
           nullptr);
  }
  unet("middle_block.0.", "mid_block.resnets.0.", &resnet);
  unet("middle_block.1.", "mid_block.attentions.0.", nullptr);
  unet("middle_block.2.", "mid_block.resnets.1.", &resnet);

  int output = 0;
  for (size_t i = 0; i < levels; ++i) {
    const bool attention = config.up_block_types[i] == "CrossAttnUpBlock2D";
    const int64_t up_layers = layers[levels - 1 - i] + 1;
    for (int64_t j = 0; j < up_layers; ++j, ++output) {
      unet(fmt::format("output_blocks.{}.0.", output), fmt::format("up_blocks.{}.resnets.{}.", i, j), &resnet);
      if (attention)
        unet(fmt::format("output_blocks.{}.1.", output), fmt::format("up_blocks.{}.attentions.{}.", i, j), nullptr);
      if (i + 1 < levels && j + 1 == up_layers)
        unet(fmt::format("output_blocks.{}.{}.", output, attention ? 2 : 1),
             fmt::format("up_blocks.{}.upsamplers.0.", i), nullptr);
    }
  }
}

// The LDM VAE numbers the decoder's levels from the bottom (up.3 is diffusers' up_blocks.0) and keeps the mid-block
// attention as 1x1 convolutions. diffusers' convert_diffusers_to_original_stable_diffusion.py numbers them 3 - i
// whatever their count (it assumes SD's four), so a smaller VAE's file has up.3, up.2, ...; files are read and
// written that way, which for SD's four levels is the LDM numbering itself.
void LdmNames::add_vae(const VaeConfig& config) {
  static const std::vector<Leaf> resnet = {{"nin_shortcut.", "conv_shortcut."}};
  static const std::vector<Leaf> attention = {{"norm.", "group_norm."},
                                              {"q.", "to_q.", 0, 1, true},
                                              {"k.", "to_k.", 0, 1, true},
                                              {"v.", "to_v.", 0, 1, true},
                                              {"proj_out.", "to_out.0.", 0, 1, true}};
  const auto vae = [&](const std::string& ldm, const std::string& diffusers, const std::vector<Leaf>* leaves) {
    add(Component::kVae, kVaePrefix + ldm, diffusers, leaves);
  };
  for (const std::string coder : {"encoder", "decoder"}) {
    vae(coder + ".conv_in.", coder + ".conv_in.", nullptr);
    vae(coder + ".conv_out.", coder + ".conv_out.", nullptr);
    vae(coder + ".norm_out.", coder + ".conv_norm_out.", nullptr);
    vae(coder + ".mid.block_1.", coder + ".mid_block.resnets.0.", &resnet);
    vae(coder + ".mid.attn_1.", coder + ".mid_block.attentions.0.", &attention);
    vae(coder + ".mid.block_2.", coder + ".mid_block.resnets.1.", &resnet);
  }
  vae("quant_conv.", "quant_conv.", nullptr);
  vae("post_quant_conv.", "post_quant_conv.", nullptr);

  const size_t levels = config.block_out_channels.size();
  for (size_t i = 0; i < levels; ++i) {
    const size_t from_bottom = std::max<size_t>(levels, 4) - 1 - i;
    for (int64_t j = 0; j < config.layers_per_block; ++j)
      vae(fmt::format("encoder.down.{}.block.{}.", i, j), fmt::format("encoder.down_blocks.{}.resnets.{}.", i, j),
          &resnet);
    for (int64_t j = 0; j <= config.layers_per_block; ++j)
      vae(fmt::format("decoder.up.{}.block.{}.", from_bottom, j), fmt::format("decoder.up_blocks.{}.resnets.{}.", i, j),
          &resnet);
    if (i + 1 < levels) {
      vae(fmt::format("encoder.down.{}.downsample.", i), fmt::format("encoder.down_blocks.{}.downsamplers.0.", i),
          nullptr);
      vae(fmt::format("decoder.up.{}.upsample.", from_bottom), fmt::format("decoder.up_blocks.{}.upsamplers.0.", i),
          nullptr);
    }
  }
}

// SD-1 stores transformers' CLIPTextModel as it is; SD-2 stores OpenCLIP's text tower, of which diffusers keeps the
// first num_hidden_layers residual blocks (the checkpoint's last block and text projection go unused).
void LdmNames::add_text_encoder(const ClipTextConfig& config) {
  if (text_layout_ == TextEncoderLayout::kOpenAiClip) {
    add(Component::kTextEncoder, kOpenAiClipPrefix, "");
    // Older SD-1 checkpoints (and merges made from them) hold CLIP's layers without transformers' text_model.
    // level; A1111 renames them the same way when it loads one (checkpoint_dict_replacements).
    for (const char* part : {"embeddings.", "encoder.", "final_layer_norm."})
      add_older_spelling(Component::kTextEncoder, std::string(kOpenAiClipPrefix) + part,
                         std::string("text_model.") + part);
    return;
  }
  static const std::vector<Leaf> block = {
      {"ln_1.", "layer_norm1."},
      {"ln_2.", "layer_norm2."},
      {"mlp.c_fc.", "mlp.fc1."},
      {"mlp.c_proj.", "mlp.fc2."},
      {"attn.out_proj.", "self_attn.out_proj."},
      {"attn.in_proj_weight", "self_attn.q_proj.weight", 0, 3},
      {"attn.in_proj_weight", "self_attn.k_proj.weight", 1, 3},
      {"attn.in_proj_weight", "self_attn.v_proj.weight", 2, 3},
      {"attn.in_proj_bias", "self_attn.q_proj.bias", 0, 3},
      {"attn.in_proj_bias", "self_attn.k_proj.bias", 1, 3},
      {"attn.in_proj_bias", "self_attn.v_proj.bias", 2, 3},
  };
  const auto text = [&](const std::string& ldm, const std::string& diffusers, const std::vector<Leaf>* leaves) {
    add(Component::kTextEncoder, kOpenClipPrefix + ldm, diffusers, leaves);
  };
  text("token_embedding.", "text_model.embeddings.token_embedding.", nullptr);
  text("positional_embedding", "text_model.embeddings.position_embedding.weight", nullptr);
  text("ln_final.", "text_model.final_layer_norm.", nullptr);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i)
    text(fmt::format("transformer.resblocks.{}.", i), fmt::format("text_model.encoder.layers.{}.", i), &block);
}

LdmLocation LdmNames::to_ldm(Component component, const std::string& name) const {
  const Module* best = nullptr;
  for (const Module& m : modules_)
    if (m.component == component && !m.read_only && matches(m.diffusers, name) &&
        (!best || m.diffusers.size() > best->diffusers.size()))
      best = &m;
  SD_CHECK(best, "{} tensor '{}' has no place in the single-file (LDM) layout", component_folder(component), name);
  const std::string rest = name.substr(best->diffusers.size());
  if (best->leaves)
    for (const Leaf& leaf : *best->leaves)
      if (matches(leaf.diffusers, rest)) {
        const std::string tail = rest.substr(leaf.diffusers.size());
        return {best->ldm + leaf.ldm + tail, leaf.chunk, leaf.chunks, leaf.conv1x1_weight && tail == "weight"};
      }
  return {best->ldm + rest};
}

std::vector<std::pair<Component, std::string>> LdmNames::to_diffusers(const std::string& key) const {
  const Module* best = nullptr;
  for (const Module& m : modules_)
    if (matches(m.ldm, key) && (!best || m.ldm.size() > best->ldm.size())) best = &m;
  if (!best) return {};
  const std::string rest = key.substr(best->ldm.size());
  std::vector<std::pair<Component, std::string>> out;
  if (best->leaves)
    for (const Leaf& leaf : *best->leaves)
      if (matches(leaf.ldm, rest))
        out.emplace_back(best->component, best->diffusers + leaf.diffusers + rest.substr(leaf.ldm.size()));
  if (out.empty()) out.emplace_back(best->component, best->diffusers + rest);
  return out;
}

}  // namespace sd::models
