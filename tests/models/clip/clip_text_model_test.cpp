#include "models/clip/clip_text_model.h"

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "models/model_test_util.h"
#include "models/weights.h"
#include "test_util.h"
#include "text/clip_tokenizer.h"

namespace sd::models {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using sd::test::close_rel_max;
using sd::test::TempDir;

fs::path encoder_dir(const std::string& pipeline) { return sd::test::fixtures() / pipeline / "text_encoder"; }

using sd::test::error_of;

// max|a-b| / max|b|, for reporting the worst ratio seen.
double ratio(const at::Tensor& a, const at::Tensor& b) {
  auto ad = a.detach().to(at::kDouble), bd = b.detach().to(at::kDouble);
  return (ad - bd).abs().max().item<double>() / bd.abs().max().item<double>();
}

void check_parity(const std::string& pipeline) {
  const auto golden = io::load_safetensors(sd::test::golden(pipeline + "/text_encoder.safetensors"));
  const json meta = json::parse(io::read_text_file(sd::test::golden(pipeline + "/text_encoder.json")));
  const at::Tensor input_ids = golden.at("input.input_ids");

  // The golden ids are the pipeline tokenizer's output for the listed prompts.
  const auto tokenizer = text::ClipTokenizer::load(sd::test::fixtures() / pipeline / "tokenizer");
  const auto prompts = meta["prompts"].get<std::vector<std::string>>();
  ASSERT_EQ(static_cast<int64_t>(prompts.size()), input_ids.size(0));
  for (size_t i = 0; i < prompts.size(); ++i) {
    const at::Tensor row = input_ids[static_cast<int64_t>(i)].contiguous();
    EXPECT_EQ(tokenizer.encode(prompts[i]),
              std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel()))
        << prompts[i];
  }

  ClipTextModel model = load_text_encoder(encoder_dir(pipeline));
  const int64_t layers = model->config().num_hidden_layers;
  ClipTextOutput out = model->forward(input_ids);
  double worst_forward = 0, worst_grad = 0;
  auto expect_close = [&](const at::Tensor& actual, const std::string& key, double tol, double& worst) {
    EXPECT_TRUE(close_rel_max(actual, golden.at(key), tol)) << pipeline << " " << key;
    worst = std::max(worst, ratio(actual, golden.at(key)));
  };
  expect_close(out.last_hidden_state, "last_hidden_state", 1e-4, worst_forward);
  expect_close(out.pooler_output, "pooler_output", 1e-4, worst_forward);
  ASSERT_EQ(static_cast<int64_t>(out.hidden_states.size()), layers + 1);
  for (int64_t k = 0; k <= layers; ++k)
    expect_close(out.hidden_states[static_cast<size_t>(k)], "hidden_states." + std::to_string(k), 1e-4, worst_forward);

  const at::Tensor loss = (out.last_hidden_state * golden.at("input.loss_weights")).sum();
  expect_close(loss.reshape({1}), "loss", 1e-4, worst_forward);
  loss.backward();

  const at::Tensor token_grad = model->token_embedding()->weight.grad();
  const at::Tensor row_ids = golden.at("grad_token_embedding_row_ids");
  expect_close(token_grad.index_select(0, row_ids), "grad_token_embedding_rows", 1e-3, worst_grad);
  at::Tensor others = token_grad.clone();
  others.index_fill_(0, row_ids, 0.0);
  EXPECT_EQ(others.abs().max().item<float>(), 0.0f) << "gradient on rows of ids that are not in the input";
  expect_close(model->text_model->embeddings->position_embedding->weight.grad(), "grad_position_embedding", 1e-3,
               worst_grad);
  expect_close(model->text_model->final_layer_norm->weight.grad(), "grad_final_layer_norm.weight", 1e-3, worst_grad);
  ::testing::Test::RecordProperty("worst_forward_ratio", std::to_string(worst_forward));
  ::testing::Test::RecordProperty("worst_grad_ratio", std::to_string(worst_grad));
  std::printf("[ %s ] worst max|err|/max|ref|: forward %.3g, gradients %.3g\n", pipeline.c_str(), worst_forward,
              worst_grad);
}

TEST(ClipTextModel, ParitySd1QuickGeluLegacyPooling) { check_parity("tiny-sd1"); }
TEST(ClipTextModel, ParitySd2GeluEosPooling) { check_parity("tiny-sd2"); }

// Heads of up to 16 channels (tiny-sd1's 4 heads of 8) take the fused causal kernel, whose numbers the parity tests
// above check; float64 keeps the batched-matmul path, which Float64MatchesGolden checks.
TEST(ClipTextModel, SmallHeadsTakeTheFusedCausalAttention) {
  const at::Tensor ids =
      io::load_safetensors(sd::test::golden("tiny-sd1/text_encoder.safetensors")).at("input.input_ids");
  ClipTextModel model = load_text_encoder(encoder_dir("tiny-sd1"));
  EXPECT_TRUE(sd::test::graph_has_node(model->forward(ids).last_hidden_state, "SmallHeadAttention"));
  ClipTextModel float64 = load_text_encoder(encoder_dir("tiny-sd1"), at::kDouble);
  const at::Tensor out = float64->forward(ids).last_hidden_state;
  EXPECT_FALSE(sd::test::graph_has_node(out, "SmallHeadAttention"));
  EXPECT_TRUE(sd::test::graph_has_node(out, "BmmBackward"));
}

// transformers' gradient checkpointing: the same outputs and parameter gradients, the layers' activations recomputed
// in backward instead of kept (only the layer inputs stay in the graph).
TEST(ClipTextModel, GradientCheckpointingGivesTheSameGradients) {
  const auto golden = io::load_safetensors(sd::test::golden("tiny-sd1/text_encoder.safetensors"));
  auto gradients = [&](bool checkpointing) {
    ClipTextModel model = load_text_encoder(encoder_dir("tiny-sd1"));
    model->set_gradient_checkpointing(checkpointing);
    const at::Tensor out = model->forward(golden.at("input.input_ids")).last_hidden_state;
    EXPECT_EQ(sd::test::graph_has_node(out, "SmallHeadAttention"), !checkpointing);
    (out * golden.at("input.loss_weights")).sum().backward();
    std::map<std::string, at::Tensor> grads;
    for (const auto& p : model->named_parameters()) grads[p.key()] = p.value().grad();
    return std::make_pair(out.detach(), grads);
  };
  const auto [plain_out, plain] = gradients(false);
  const auto [out, checkpointed] = gradients(true);
  EXPECT_TRUE(at::equal(out, plain_out));
  for (const auto& [name, grad] : plain) {
    ASSERT_TRUE(checkpointed.at(name).defined()) << name;
    EXPECT_TRUE(at::equal(checkpointed.at(name), grad)) << name;
  }
}

TEST(ClipTextModel, Bf16WeightsRunAndStayClose) {
  const auto golden = io::load_safetensors(sd::test::golden("tiny-sd1/text_encoder.safetensors"));
  ClipTextModel model = load_text_encoder(encoder_dir("tiny-sd1"), at::kBFloat16);
  for (const auto& p : model->parameters()) ASSERT_EQ(p.scalar_type(), at::kBFloat16);
  ClipTextOutput out = model->forward(golden.at("input.input_ids"));
  EXPECT_EQ(out.last_hidden_state.scalar_type(), at::kBFloat16);
  // bf16 keeps ~3 significant digits; 5 layers of it stay within a few percent.
  EXPECT_TRUE(close_rel_max(out.last_hidden_state, golden.at("last_hidden_state"), 5e-2));
  EXPECT_TRUE(close_rel_max(out.pooler_output, golden.at("pooler_output"), 5e-2));
  std::printf("[ bf16 ] last_hidden_state max|err|/max|ref| %.3g\n",
              ratio(out.last_hidden_state, golden.at("last_hidden_state")));
  // Training through bf16 weights works too.
  (out.last_hidden_state.to(at::kFloat) * golden.at("input.loss_weights")).sum().backward();
  EXPECT_TRUE(close_rel_max(model->text_model->final_layer_norm->weight.grad(),
                            golden.at("grad_final_layer_norm.weight"), 5e-2));
}

// diffusers' textual_inversion.py under --mixed_precision bf16: accelerate's autocast runs the linear layers and the
// attention matmuls in bf16, the residual stream, layer norms and softmax in float32.
TEST(ClipTextModel, Bf16LinearsCopyKeepsTheStreamFloat32) {
  const auto golden = io::load_safetensors(sd::test::golden("tiny-sd1/text_encoder.safetensors"));
  ClipTextModel model = load_text_encoder(encoder_dir("tiny-sd1"));
  ClipTextModel mixed = model->with_linears_in(at::kBFloat16);
  const auto sources = model->named_parameters();
  int64_t linear_weights = 0;
  for (const auto& p : mixed->named_parameters()) {
    const at::Tensor& source = sources[p.key()];
    EXPECT_EQ(source.scalar_type(), at::kFloat) << p.key() << ": the source model is left as it was";
    const bool in_linear = p.key().find("_proj.") != std::string::npos || p.key().find(".fc") != std::string::npos;
    if (in_linear) {
      ++linear_weights;
      EXPECT_EQ(p.value().scalar_type(), at::kBFloat16) << p.key();
      EXPECT_TRUE(at::equal(p.value(), source.to(at::kBFloat16))) << p.key();
    } else {
      EXPECT_EQ(p.value().data_ptr(), source.data_ptr()) << p.key() << " is shared, not copied";
    }
  }
  EXPECT_EQ(linear_weights, 2 * 6 * model->config().num_hidden_layers);  // q, k, v, out, fc1, fc2: weight and bias

  const at::Tensor ids = golden.at("input.input_ids");
  const at::Tensor embeds = model->token_embedding()->forward(ids).detach().requires_grad_(true);
  ClipTextOutput out = mixed->forward(ids, embeds);
  for (const auto& h : out.hidden_states) EXPECT_EQ(h.scalar_type(), at::kFloat);
  EXPECT_EQ(out.last_hidden_state.scalar_type(), at::kFloat);
  const double err = ratio(out.last_hidden_state, golden.at("last_hidden_state"));
  EXPECT_GT(err, 0) << "the matmuls ran in bf16";
  EXPECT_TRUE(close_rel_max(out.last_hidden_state, golden.at("last_hidden_state"), 2e-2));
  std::printf("[ bf16 linears ] last_hidden_state max|err|/max|ref| %.3g\n", err);

  // The gradient reaches the float32 token embeddings textual inversion trains.
  (out.last_hidden_state * golden.at("input.loss_weights")).sum().backward();
  const at::Tensor row_ids = golden.at("grad_token_embedding_row_ids");
  const at::Tensor rows =
      at::zeros_like(model->token_embedding()->weight).index_add_(0, ids.flatten(), embeds.grad().flatten(0, 1));
  EXPECT_TRUE(close_rel_max(rows.index_select(0, row_ids), golden.at("grad_token_embedding_rows"), 5e-2));
}

TEST(ClipTextModel, Float64MatchesGolden) {
  const auto golden = io::load_safetensors(sd::test::golden("tiny-sd2/text_encoder.safetensors"));
  ClipTextModel model = load_text_encoder(encoder_dir("tiny-sd2"), at::kDouble);
  torch::NoGradGuard no_grad;
  ClipTextOutput out = model->forward(golden.at("input.input_ids"));
  EXPECT_EQ(out.last_hidden_state.scalar_type(), at::kDouble);
  EXPECT_TRUE(close_rel_max(out.last_hidden_state, golden.at("last_hidden_state"), 1e-4));
  EXPECT_TRUE(close_rel_max(out.pooler_output, golden.at("pooler_output"), 1e-4));
}

TEST(ClipTextModel, AcceptsPositionIdsAndHalfPrecisionFiles) {
  TempDir dir;
  auto weights = io::load_safetensors(encoder_dir("tiny-sd2") / "model.safetensors");
  for (auto& [name, t] : weights) t = t.to(at::kHalf);
  weights["text_model.embeddings.position_ids"] = at::arange(77, at::kLong).unsqueeze(0);
  io::save_safetensors(dir.path() / "model.safetensors", weights);
  fs::copy_file(encoder_dir("tiny-sd2") / "config.json", dir.path() / "config.json");

  ClipTextModel model = load_text_encoder(dir.path(), at::kFloat);
  const auto golden = io::load_safetensors(sd::test::golden("tiny-sd2/text_encoder.safetensors"));
  torch::NoGradGuard no_grad;
  ClipTextOutput out = model->forward(golden.at("input.input_ids"));
  EXPECT_EQ(out.last_hidden_state.scalar_type(), at::kFloat);
  EXPECT_TRUE(close_rel_max(out.last_hidden_state, golden.at("last_hidden_state"), 2e-2));
  EXPECT_FALSE(close_rel_max(out.last_hidden_state, golden.at("last_hidden_state"), 1e-6));  // fp16 rounding is visible
}

TEST(ClipTextModel, LoadErrorsNameTheFileAndKey) {
  TempDir dir;
  EXPECT_NE(error_of([&] { load_text_encoder(dir.path()); }).find((dir.path() / "config.json").string()),
            std::string::npos);

  fs::copy_file(encoder_dir("tiny-sd1") / "config.json", dir.path() / "config.json");
  std::string err = error_of([&] { load_text_encoder(dir.path()); });
  EXPECT_NE(err.find((dir.path() / "model.safetensors").string() + ": missing file"), std::string::npos) << err;

  auto weights = io::load_safetensors(encoder_dir("tiny-sd1") / "model.safetensors");
  weights["text_model.encoder.layers.3.mlp.fc1.weight"] = at::zeros({36, 32});
  io::save_safetensors(dir.path() / "model.safetensors", weights);
  err = error_of([&] { load_text_encoder(dir.path()); });
  EXPECT_NE(err.find((dir.path() / "model.safetensors").string()), std::string::npos) << err;
  EXPECT_NE(err.find("text_model.encoder.layers.3.mlp.fc1.weight"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;

  weights = io::load_safetensors(encoder_dir("tiny-sd1") / "model.safetensors");
  weights.erase("text_model.final_layer_norm.bias");
  io::save_safetensors(dir.path() / "model.safetensors", weights);
  err = error_of([&] { load_text_encoder(dir.path()); });
  EXPECT_NE(err.find("missing keys: text_model.final_layer_norm.bias"), std::string::npos) << err;

  err = error_of([&] { load_text_encoder(encoder_dir("tiny-sd1"), at::kHalf); });
  EXPECT_NE(err.find("float16"), std::string::npos) << err;
}

TEST(ClipTextConfig, RoundTripsFixtureConfigs) {
  for (const std::string pipeline : {"tiny-sd1", "tiny-sd2"}) {
    const auto file = io::JsonConfig::load(encoder_dir(pipeline) / "config.json");
    const ClipTextConfig c = ClipTextConfig::from_json(file);
    EXPECT_EQ(c.to_json(), file.raw()) << pipeline;
  }
  const ClipTextConfig sd1 = ClipTextConfig::load(encoder_dir("tiny-sd1") / "config.json");
  EXPECT_EQ(sd1.hidden_size, 32);
  EXPECT_EQ(sd1.intermediate_size, 37);
  EXPECT_EQ(sd1.num_hidden_layers, 5);
  EXPECT_EQ(sd1.eos_token_id, 2);
  EXPECT_EQ(sd1.hidden_act, "quick_gelu");
  const ClipTextConfig sd2 = ClipTextConfig::load(encoder_dir("tiny-sd2") / "config.json");
  EXPECT_EQ(sd2.hidden_act, "gelu");
  EXPECT_EQ(sd2.eos_token_id, 49407);
}

TEST(ClipTextConfig, DefaultsUnknownKeysAndClipConfigs) {
  const ClipTextConfig d = ClipTextConfig::from_json(io::JsonConfig(json::object(), "mem.json"));
  EXPECT_EQ(d.vocab_size, 49408);
  EXPECT_EQ(d.hidden_size, 512);
  EXPECT_EQ(d.intermediate_size, 2048);
  EXPECT_EQ(d.num_hidden_layers, 12);
  EXPECT_EQ(d.num_attention_heads, 8);
  EXPECT_EQ(d.max_position_embeddings, 77);
  EXPECT_EQ(d.hidden_act, "quick_gelu");
  EXPECT_DOUBLE_EQ(d.layer_norm_eps, 1e-5);
  EXPECT_EQ(d.pad_token_id, 1);
  EXPECT_EQ(d.bos_token_id, 49406);
  EXPECT_EQ(d.eos_token_id, 49407);

  const json old = {{"dropout", 0.0}, {"_name_or_path", "x/y"}, {"hidden_size", 64}, {"num_attention_heads", 4}};
  const ClipTextConfig o = ClipTextConfig::from_json(io::JsonConfig(old, "old.json"));
  EXPECT_EQ(o.to_json()["dropout"], 0.0);
  EXPECT_FALSE(o.to_json().contains("_name_or_path"));

  const json full = {{"model_type", "clip"}, {"text_config", {{"hidden_size", 48}, {"num_attention_heads", 6}}}};
  EXPECT_EQ(ClipTextConfig::from_json(io::JsonConfig(full, "clip.json")).hidden_size, 48);
}

TEST(ClipTextConfig, BadValuesNameFileAndKey) {
  auto err = [](const json& j) {
    return error_of([&] { ClipTextConfig::from_json(io::JsonConfig(j, "/x/config.json")); });
  };
  EXPECT_EQ(err({{"hidden_size", "big"}}), "/x/config.json: key 'hidden_size' must be an integer, got \"big\"");
  EXPECT_NE(err({{"layer_norm_eps", "1e-5"}}).find("key 'layer_norm_eps'"), std::string::npos);
  EXPECT_NE(err({{"hidden_act", "swishy"}}).find("/x/config.json: key 'hidden_act'"), std::string::npos);
  EXPECT_NE(err({{"hidden_size", 30}, {"num_attention_heads", 4}}).find("key 'num_attention_heads'"),
            std::string::npos);
  EXPECT_NE(err({{"num_hidden_layers", 0}}).find("key 'num_hidden_layers'"), std::string::npos);
  EXPECT_NE(err({{"model_type", "bert"}}).find("key 'model_type'"), std::string::npos);
  EXPECT_NE(err({{"architectures", "CLIPTextModel"}}).find("key 'architectures'"), std::string::npos);
}

TEST(ClipTextConfig, ParameterCounts) {
  EXPECT_EQ(ClipTextConfig::sd15().parameter_count(), 123060480);
  EXPECT_EQ(ClipTextConfig::sd2().parameter_count(), 340387840);
  ClipTextConfig odd;
  odd.vocab_size = 101, odd.hidden_size = 24, odd.intermediate_size = 50, odd.num_hidden_layers = 3;
  odd.num_attention_heads = 3, odd.max_position_embeddings = 13;
  for (const ClipTextConfig& c : {ClipTextConfig::load(encoder_dir("tiny-sd1") / "config.json"),
                                  ClipTextConfig::load(encoder_dir("tiny-sd2") / "config.json"), odd}) {
    ClipTextModel model(c);
    EXPECT_EQ(parameter_count(*model), c.parameter_count());
  }
}

TEST(ClipTextModel, ParameterNamesAreTransformers) {
  ClipTextModel model(ClipTextConfig::load(encoder_dir("tiny-sd1") / "config.json"));
  const io::SafeTensorsFile file(encoder_dir("tiny-sd1") / "model.safetensors");
  std::vector<std::string> names;
  for (const auto& [name, t] : named_weights(*model)) names.push_back(name);
  std::vector<std::string> in_file = file.names();
  std::sort(in_file.begin(), in_file.end());
  EXPECT_EQ(names, in_file);
}

TEST(ClipTextModel, ResizeTokenEmbeddingsForTextualInversion) {
  ClipTextModel model = load_text_encoder(encoder_dir("tiny-sd1"));
  const at::Tensor before = model->token_embedding()->weight.detach().clone();
  model->resize_token_embeddings(49409);
  EXPECT_EQ(model->config().vocab_size, 49409);
  const at::Tensor& w = model->token_embedding()->weight;
  ASSERT_EQ(w.size(0), 49409);
  EXPECT_TRUE(at::equal(w.narrow(0, 0, 49408), before));
  model->copy_token_embedding_row(5988, 49408);
  EXPECT_TRUE(at::equal(w[49408], before[5988]));
  // The trainable placeholder id is the largest id, so the legacy (eos_token_id == 2) pooling picks it.
  const auto golden = io::load_safetensors(sd::test::golden("tiny-sd1/text_encoder.safetensors"));
  at::Tensor ids = golden.at("input.input_ids").clone();
  ids[0][3] = 49408;
  ClipTextOutput out = model->forward(ids);
  EXPECT_TRUE(at::equal(out.pooler_output[0], out.last_hidden_state[0][3]));
  out.last_hidden_state.sum().backward();
  EXPECT_GT(w.grad()[49408].abs().sum().item<float>(), 0.0f);
  // Growing by many rows draws each new one N(0, 1), as a fresh nn.Embedding is.
  model->resize_token_embeddings(49408 + 1000);
  const at::Tensor added = model->token_embedding()->weight.detach().narrow(0, 49409, 999);
  EXPECT_NEAR(added.mean().item<double>(), 0.0, 0.01);
  EXPECT_NEAR(added.std().item<double>(), 1.0, 0.01);
  // Shrinking keeps the leading rows.
  model->resize_token_embeddings(100);
  EXPECT_TRUE(at::equal(model->token_embedding()->weight, before.narrow(0, 0, 100)));
}

TEST(ClipTextModel, SaveAndReloadGivesSameOutputs) {
  TempDir dir;
  ClipTextModel model = load_text_encoder(encoder_dir("tiny-sd2"));
  save_text_encoder(model, dir.path());
  EXPECT_EQ(json::parse(io::read_text_file(dir.path() / "config.json")),
            json::parse(io::read_text_file(encoder_dir("tiny-sd2") / "config.json")));
  ClipTextModel again = load_text_encoder(dir.path());
  const auto golden = io::load_safetensors(sd::test::golden("tiny-sd2/text_encoder.safetensors"));
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(again->forward(golden.at("input.input_ids")).last_hidden_state,
                        model->forward(golden.at("input.input_ids")).last_hidden_state));
}

}  // namespace
}  // namespace sd::models
