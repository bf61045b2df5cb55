// The diffusers <-> single-file (LDM) key mapping: known pairs from the reference conversion scripts for SD-1.5 and
// SD-2 configs, both directions agreeing, and the keys diffusers drops.
#include "models/name_conversion.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace sd::models {
namespace {

struct Pair {
  Component component;
  std::string diffusers;
  std::string ldm;
};

void expect_pairs(const LdmNames& names, const std::vector<Pair>& pairs) {
  for (const auto& p : pairs) {
    EXPECT_EQ(names.to_ldm(p.component, p.diffusers).key, p.ldm) << p.diffusers;
    const auto back = names.to_diffusers(p.ldm);
    ASSERT_EQ(back.size(), 1u) << p.ldm;
    EXPECT_EQ(back[0].first, p.component) << p.ldm;
    EXPECT_EQ(back[0].second, p.diffusers) << p.ldm;
  }
}

TEST(NameConversion, Sd15KeysMatchTheReferenceScripts) {
  const LdmNames names(UNetConfig::sd15(), VaeConfig::sd(), ClipTextConfig::sd15());
  EXPECT_EQ(names.text_encoder_layout(), TextEncoderLayout::kOpenAiClip);
  expect_pairs(names, {{Component::kUnet, "time_embedding.linear_2.bias", "model.diffusion_model.time_embed.2.bias"},
                       {Component::kUnet, "conv_in.weight", "model.diffusion_model.input_blocks.0.0.weight"},
                       {Component::kUnet, "down_blocks.0.resnets.1.norm1.weight",
                        "model.diffusion_model.input_blocks.2.0.in_layers.0.weight"},
                       {Component::kUnet, "down_blocks.1.attentions.0.proj_in.weight",
                        "model.diffusion_model.input_blocks.4.1.proj_in.weight"},
                       {Component::kUnet, "down_blocks.2.downsamplers.0.conv.bias",
                        "model.diffusion_model.input_blocks.9.0.op.bias"},
                       {Component::kUnet, "down_blocks.3.resnets.1.time_emb_proj.weight",
                        "model.diffusion_model.input_blocks.11.0.emb_layers.1.weight"},
                       {Component::kUnet, "mid_block.attentions.0.transformer_blocks.0.attn2.to_k.weight",
                        "model.diffusion_model.middle_block.1.transformer_blocks.0.attn2.to_k.weight"},
                       {Component::kUnet, "mid_block.resnets.1.conv2.weight",
                        "model.diffusion_model.middle_block.2.out_layers.3.weight"},
                       {Component::kUnet, "up_blocks.0.resnets.2.conv1.weight",
                        "model.diffusion_model.output_blocks.2.0.in_layers.2.weight"},
                       {Component::kUnet, "up_blocks.0.upsamplers.0.conv.weight",
                        "model.diffusion_model.output_blocks.2.1.conv.weight"},
                       {Component::kUnet, "up_blocks.1.upsamplers.0.conv.weight",
                        "model.diffusion_model.output_blocks.5.2.conv.weight"},
                       {Component::kUnet, "up_blocks.3.attentions.2.proj_out.bias",
                        "model.diffusion_model.output_blocks.11.1.proj_out.bias"},
                       {Component::kUnet, "up_blocks.3.resnets.0.conv_shortcut.weight",
                        "model.diffusion_model.output_blocks.9.0.skip_connection.weight"},
                       {Component::kUnet, "conv_out.bias", "model.diffusion_model.out.2.bias"},
                       {Component::kVae, "encoder.down_blocks.1.downsamplers.0.conv.weight",
                        "first_stage_model.encoder.down.1.downsample.conv.weight"},
                       {Component::kVae, "decoder.up_blocks.0.resnets.2.norm2.bias",
                        "first_stage_model.decoder.up.3.block.2.norm2.bias"},
                       {Component::kVae, "decoder.up_blocks.2.upsamplers.0.conv.weight",
                        "first_stage_model.decoder.up.1.upsample.conv.weight"},
                       {Component::kVae, "decoder.up_blocks.3.resnets.0.conv_shortcut.bias",
                        "first_stage_model.decoder.up.0.block.0.nin_shortcut.bias"},
                       {Component::kVae, "encoder.conv_norm_out.weight", "first_stage_model.encoder.norm_out.weight"},
                       {Component::kVae, "decoder.mid_block.attentions.0.group_norm.bias",
                        "first_stage_model.decoder.mid.attn_1.norm.bias"},
                       {Component::kVae, "encoder.mid_block.resnets.1.conv1.weight",
                        "first_stage_model.encoder.mid.block_2.conv1.weight"},
                       {Component::kTextEncoder, "text_model.encoder.layers.11.mlp.fc2.weight",
                        "cond_stage_model.transformer.text_model.encoder.layers.11.mlp.fc2.weight"}});
  const LdmLocation q = names.to_ldm(Component::kVae, "encoder.mid_block.attentions.0.to_q.weight");
  EXPECT_EQ(q.key, "first_stage_model.encoder.mid.attn_1.q.weight");
  EXPECT_TRUE(q.conv1x1);
  EXPECT_FALSE(names.to_ldm(Component::kVae, "encoder.mid_block.attentions.0.to_out.0.bias").conv1x1);
  EXPECT_EQ(names.to_ldm(Component::kVae, "decoder.mid_block.attentions.0.to_out.0.weight").key,
            "first_stage_model.decoder.mid.attn_1.proj_out.weight");
}

TEST(NameConversion, KeysDiffusersDoesNotUseMapToNothing) {
  const LdmNames names(UNetConfig::sd15(), VaeConfig::sd(), ClipTextConfig::sd15());
  for (const char* key : {"model_ema.decay", "model_ema.diffusion_modelinput_blocks00weight", "alphas_cumprod",
                          "first_stage_model.loss.logvar", "lora_unet_down_blocks_0"})
    EXPECT_TRUE(names.to_diffusers(key).empty()) << key;
}

TEST(NameConversion, Sd2TextEncoderUsesOpenClipNamesWithFusedQkv) {
  const LdmNames names(UNetConfig::sd2(), VaeConfig::sd(), ClipTextConfig::sd2());
  EXPECT_EQ(names.text_encoder_layout(), TextEncoderLayout::kOpenClip);
  expect_pairs(names,
               {{Component::kTextEncoder, "text_model.embeddings.position_embedding.weight",
                 "cond_stage_model.model.positional_embedding"},
                {Component::kTextEncoder, "text_model.embeddings.token_embedding.weight",
                 "cond_stage_model.model.token_embedding.weight"},
                {Component::kTextEncoder, "text_model.final_layer_norm.bias", "cond_stage_model.model.ln_final.bias"},
                {Component::kTextEncoder, "text_model.encoder.layers.3.layer_norm2.weight",
                 "cond_stage_model.model.transformer.resblocks.3.ln_2.weight"},
                {Component::kTextEncoder, "text_model.encoder.layers.22.mlp.fc1.bias",
                 "cond_stage_model.model.transformer.resblocks.22.mlp.c_fc.bias"},
                {Component::kTextEncoder, "text_model.encoder.layers.0.self_attn.out_proj.weight",
                 "cond_stage_model.model.transformer.resblocks.0.attn.out_proj.weight"}});
  const auto fused = names.to_diffusers("cond_stage_model.model.transformer.resblocks.5.attn.in_proj_weight");
  ASSERT_EQ(fused.size(), 3u);
  const char* parts[] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(fused[i].second, fmt::format("text_model.encoder.layers.5.self_attn.{}_proj.weight", parts[i]));
    const LdmLocation where = names.to_ldm(Component::kTextEncoder, fused[i].second);
    EXPECT_EQ(where.key, "cond_stage_model.model.transformer.resblocks.5.attn.in_proj_weight");
    EXPECT_EQ(where.chunk, i);
    EXPECT_EQ(where.chunks, 3);
  }
  // OpenCLIP's 24th block and projection are not part of diffusers' 23-layer text encoder.
  EXPECT_TRUE(names.to_diffusers("cond_stage_model.model.transformer.resblocks.23.ln_1.weight").empty());
  EXPECT_TRUE(names.to_diffusers("cond_stage_model.model.text_projection").empty());
  EXPECT_EQ(names.to_ldm(Component::kUnet, "down_blocks.0.attentions.1.proj_in.weight").key,
            "model.diffusion_model.input_blocks.2.1.proj_in.weight");
}

TEST(NameConversion, ATensorWithoutAPlaceIsAnError) {
  const LdmNames names(UNetConfig::sd15(), VaeConfig::sd(), ClipTextConfig::sd15());
  EXPECT_THROW(names.to_ldm(Component::kUnet, "class_embedding.linear_1.weight"), Error);
}

}  // namespace
}  // namespace sd::models
