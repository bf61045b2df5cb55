// diffusers 0.24's encode_prompt on tiny-sd1: clip_skip against the text-encoder golden's hidden states (C3, taken
// before final_layer_norm, with the layer norm re-applied here in float64), negative prompts per prompt, their
// order and repetition per image, and the count rule.
#include "pipeline/prompt_encoding.h"

#include "core/error.h"
#include "io/json_config.h"
#include "io/safetensors.h"
#include "models/model_test_util.h"
#include "test_util.h"

namespace sd::pipeline {
namespace {

using sd::test::close_rel_max;
using sd::test::error_message;
using sd::test::matches_golden;

constexpr double kTol = 1e-4;  // README: text-encoder outputs

StableDiffusion& tiny_sd1() {
  static StableDiffusion pipe = load_pipeline(sd::test::fixtures() / "tiny-sd1");
  return pipe;
}

// final_layer_norm(hidden) in float64 with the encoder's own weights (eps from its config).
at::Tensor final_layer_norm_f64(StableDiffusion& pipe, const at::Tensor& hidden) {
  const auto& norm = pipe.text_encoder->text_model->final_layer_norm;
  const at::Tensor h = hidden.to(at::kDouble);
  const at::Tensor mean = h.mean(-1, true);
  const at::Tensor var = (h - mean).pow(2).mean(-1, true);
  const double eps = pipe.text_encoder->config().layer_norm_eps;
  return (h - mean) / (var + eps).sqrt() * norm->weight.to(at::kDouble) + norm->bias.to(at::kDouble);
}

TEST(EncodePrompt, ClipSkipUsesAnEarlierLayerThroughTheFinalLayerNorm) {
  StableDiffusion& pipe = tiny_sd1();
  const auto meta = sd::io::JsonConfig::load(sd::test::golden("tiny-sd1/text_encoder.json")).raw();
  const auto prompts = meta["prompts"].get<std::vector<std::string>>();
  const io::TensorMap g = io::load_safetensors(sd::test::golden("tiny-sd1/text_encoder.safetensors"));
  const int layers = 5;
  // No clip_skip and clip_skip 0 are last_hidden_state.
  EXPECT_TRUE(matches_golden("no clip_skip", encode_text(pipe, prompts), g.at("last_hidden_state"), kTol));
  EXPECT_TRUE(matches_golden("clip_skip 0", encode_text(pipe, prompts, 0), g.at("last_hidden_state"), kTol));
  for (int skip = 1; skip <= layers; ++skip) {
    const at::Tensor expected = final_layer_norm_f64(pipe, g.at("hidden_states." + std::to_string(layers - skip)));
    EXPECT_TRUE(matches_golden("clip_skip " + std::to_string(skip), encode_text(pipe, prompts, skip), expected, kTol));
  }
  EXPECT_NE(error_message([&] { encode_text(pipe, prompts, 6); }).find("clip_skip 6 is out of range"),
            std::string::npos);
}

TEST(EncodePrompt, NegativePromptsPerPromptComeFirstAndRepeatPerImage) {
  StableDiffusion& pipe = tiny_sd1();
  GenerationOptions o;
  o.prompts = {"a red cube", "a blue ball"};
  o.negative_prompts = {"blurry", "dark"};
  o.num_images_per_prompt = 2;
  const at::Tensor context = encode_prompt(pipe, o, /*guidance=*/true);
  ASSERT_EQ(context.size(0), 8);
  const at::Tensor cond = encode_text(pipe, o.prompts), uncond = encode_text(pipe, o.negative_prompts);
  // [neg0, neg0, neg1, neg1, p0, p0, p1, p1], as diffusers' repeat + view per prompt.
  for (int64_t k = 0; k < 4; ++k) {
    EXPECT_TRUE(close_rel_max(context[k], uncond[k / 2], 1e-6)) << k;
    EXPECT_TRUE(close_rel_max(context[4 + k], cond[k / 2], 1e-6)) << k;
  }
  // (Rows encoded in batches of other sizes may differ in the last bits, hence 1e-6 rather than equality.)
  // One negative prompt serves every prompt; none means "".
  o.negative_prompts = {"blurry"};
  const at::Tensor one = encode_prompt(pipe, o, true);
  for (int64_t k = 0; k < 4; ++k) EXPECT_TRUE(close_rel_max(one[k], uncond[0], 1e-6));
  o.negative_prompts.clear();
  const at::Tensor none = encode_prompt(pipe, o, true);
  EXPECT_TRUE(close_rel_max(none[3], encode_text(pipe, {""})[0], 1e-6));
  // Without guidance only the prompts' rows.
  EXPECT_EQ(encode_prompt(pipe, o, false).size(0), 4);
}

// diffusers 0.24 skips layers for the prompts only; the negative prompts keep last_hidden_state.
TEST(EncodePrompt, ClipSkipLeavesTheNegativePromptsAlone) {
  StableDiffusion& pipe = tiny_sd1();
  GenerationOptions o;
  o.prompts = {"a red cube"};
  o.negative_prompts = {"blurry"};
  o.clip_skip = 2;
  const at::Tensor context = encode_prompt(pipe, o, true);
  EXPECT_TRUE(close_rel_max(context[0], encode_text(pipe, {"blurry"})[0], 1e-6));
  EXPECT_TRUE(close_rel_max(context[1], encode_text(pipe, {"a red cube"}, 2)[0], 1e-6));
}

}  // namespace
}  // namespace sd::pipeline
