// LoRA files (pipeline/lora_file.h): the names diffusers 0.24 and kohya write, both formats read back to the same
// adapters, the reference file (C11) loads onto tiny-sd1, LyCORIS' LoHa, LoKr, Tucker LoCon, full, IA³, OFT, BOFT,
// GLoRA, norm and DoRA updates as their definitions, and one clear line for every bad file.
#include "pipeline/lora_file.h"

#include <functional>
#include <optional>

#include "io/safetensors.h"
#include "models/lora.h"
#include "models/model_test_util.h"

namespace sd::pipeline {
namespace {

namespace fs = std::filesystem;

StableDiffusion load_tiny() { return load_pipeline(sd::test::fixtures() / "tiny-sd1"); }

const std::string kUNetModule = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q";
const std::string kConvModule = "down_blocks.0.attentions.0.proj_in";  // a 1x1 conv in SD-1
const std::string kTextModule = "text_model.encoder.layers.0.self_attn.q_proj";

// Rank-2 adapters on a UNet linear (32 -> 32), a UNet 1x1 conv and a text-encoder linear (32 -> 32).
LoraWeights sample_weights(double alpha) {
  at::manual_seed(5);
  return {{LoraComponent::kUNet, kUNetModule, at::randn({2, 32}), at::randn({32, 2}), alpha},
          {LoraComponent::kUNet, kConvModule, at::randn({2, 32, 1, 1}), at::randn({32, 2, 1, 1}), alpha},
          {LoraComponent::kTextEncoder, kTextModule, at::randn({2, 32}), at::randn({32, 2}), alpha}};
}

const LoraModule& find(const LoraWeights& weights, const std::string& module) {
  for (const auto& m : weights)
    if (m.module == module) return m;
  throw std::runtime_error("no module " + module);
}

TEST(LoraFile, DiffusersFormatHasDiffusersNamesAndFoldsAlphaIntoUp) {
  sd::test::TempDir dir;
  const fs::path path = dir.path() / "pytorch_lora_weights.safetensors";
  save_lora_file(path, sample_weights(/*alpha=*/1), LoraFormat::kDiffusers);
  const io::TensorMap t = io::load_safetensors(path);
  EXPECT_EQ(t.size(), 6u);
  const LoraWeights saved = sample_weights(1);
  const LoraModule& q = find(saved, kUNetModule);
  EXPECT_TRUE(at::equal(t.at("unet." + kUNetModule + ".lora.down.weight"), q.down));
  EXPECT_TRUE(at::allclose(t.at("unet." + kUNetModule + ".lora.up.weight"), q.up * 0.5));  // alpha / rank
  EXPECT_TRUE(t.count("unet." + kConvModule + ".lora.up.weight"));
  EXPECT_TRUE(t.count("text_encoder." + kTextModule + ".lora_linear_layer.down.weight"));
  EXPECT_EQ(io::SafeTensorsFile(path).metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));

  StableDiffusion pipe = load_tiny();
  const LoraWeights back = load_lora_file(path, pipe).adapters;
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(find(back, kUNetModule).alpha, 2);  // no alpha in the file: alpha = rank
  EXPECT_EQ(find(back, kTextModule).component, LoraComponent::kTextEncoder);
}

TEST(LoraFile, KohyaFormatHasKohyaNamesAlphaAndMetadataAndReadsBack) {
  sd::test::TempDir dir;
  const fs::path path = dir.path() / "kohya.safetensors";
  save_lora_file(path, sample_weights(/*alpha=*/1), LoraFormat::kKohya, {{"ss_network_dim", "2"}});
  const io::SafeTensorsFile file(path);
  EXPECT_EQ(file.names().size(), 9u);
  for (const char* key : {"lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight",
                          "lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight",
                          "lora_te_text_model_encoder_layers_0_self_attn_q_proj.alpha"})
    EXPECT_TRUE(file.contains(key)) << key;
  const at::Tensor alpha = file.read("lora_te_text_model_encoder_layers_0_self_attn_q_proj.alpha");
  EXPECT_EQ(alpha.dim(), 0);  // kohya's register_buffer("alpha", torch.tensor(alpha))
  EXPECT_EQ(alpha.item<float>(), 1.0f);
  EXPECT_EQ(file.metadata().at("ss_network_dim"), "2");
  EXPECT_EQ(file.metadata().at("format"), "pt");

  StableDiffusion pipe = load_tiny();
  const LoraWeights back = load_lora_file(path, pipe).adapters;
  const LoraWeights original = sample_weights(1);
  ASSERT_EQ(back.size(), original.size());
  for (const auto& m : original) {
    const LoraModule& b = find(back, m.module);
    EXPECT_EQ(b.component, m.component) << m.module;
    EXPECT_TRUE(at::equal(b.down, m.down)) << m.module;
    EXPECT_TRUE(at::equal(b.up, m.up)) << m.module;
    EXPECT_EQ(b.alpha, 1) << m.module;
  }
}

TEST(LoraFile, BothFormatsGiveTheSameOutputs) {
  sd::test::TempDir dir;
  const LoraWeights weights = sample_weights(/*alpha=*/3);
  std::vector<at::Tensor> outputs;
  for (LoraFormat format : {LoraFormat::kDiffusers, LoraFormat::kKohya}) {
    const fs::path path = dir.path() / (format == LoraFormat::kKohya ? "k.safetensors" : "d.safetensors");
    save_lora_file(path, weights, format);
    StableDiffusion pipe = load_tiny();
    attach_lora(pipe, load_lora_file(path, pipe).adapters, 0.7, path.string());
    at::manual_seed(6);
    const at::Tensor ids = at::randint(0, 49407, {1, 77}, at::kLong);
    const at::Tensor text = pipe.text_encoder->forward(ids).last_hidden_state;
    outputs.push_back(pipe.unet->forward(at::randn({1, 4, 16, 16}), at::tensor({10}, at::kLong), text).detach());
  }
  EXPECT_TRUE(sd::test::close_rel_max(outputs[1], outputs[0], 1e-6));
}

TEST(LoraFile, ReferenceFileLoadsOntoTinySd1) {
  StableDiffusion pipe = load_tiny();
  const LoraFileContents contents = load_lora_file(sd::test::golden("tiny-sd1/lora_diffusers.safetensors"), pipe);
  EXPECT_TRUE(contents.updates.empty());
  const LoraWeights& weights = contents.adapters;
  ASSERT_EQ(weights.size(), 88u);  // attn1/attn2 x to_q/to_k/to_v/to_out.0 of 11 transformer blocks
  for (const auto& m : weights) {
    EXPECT_EQ(m.component, LoraComponent::kUNet);
    EXPECT_EQ(m.alpha, 4);
  }
  attach_lora(pipe, weights, 0.7, "reference");
  EXPECT_EQ(models::adapter_tensors(*pipe.unet).size(), 176u);
}

// Kohya stems may name UNet layers by their original (LDM) paths, as A1111 reads them: each loads onto the layer the
// single-file layout puts there (written out here from the SD-1 layout, layers_per_block 2 as in tiny-sd1).
TEST(LoraFile, KohyaStemsOfLdmPathsLoadOntoTheirDiffusersLayers) {
  const std::vector<std::pair<std::string, std::string>> ldm_to_diffusers = {
      {"input_blocks.1.1.transformer_blocks.0.attn1.to_q", kUNetModule},
      {"input_blocks.3.0.op", "down_blocks.0.downsamplers.0.conv"},
      {"input_blocks.4.0.in_layers.2", "down_blocks.1.resnets.0.conv1"},
      {"input_blocks.4.0.skip_connection", "down_blocks.1.resnets.0.conv_shortcut"},
      {"middle_block.1.proj_in", "mid_block.attentions.0.proj_in"},
      {"output_blocks.2.1.conv", "up_blocks.0.upsamplers.0.conv"},
      {"output_blocks.5.1.transformer_blocks.0.attn2.to_k", "up_blocks.1.attentions.2.transformer_blocks.0.attn2.to_k"},
      {"time_embed.2", "time_embedding.linear_2"},
      {"out.2", "conv_out"},
  };
  StableDiffusion pipe = load_tiny();
  const auto parameters = pipe.unet->named_parameters();
  io::TensorMap tensors;
  std::map<std::string, at::Tensor> downs;  // by diffusers path
  for (const auto& [ldm, diffusers] : ldm_to_diffusers) {
    std::string stem = "lora_unet_" + ldm;
    std::replace(stem.begin(), stem.end(), '.', '_');
    const auto [down_shape, up_shape] = models::lora_adapter_shapes(parameters[diffusers + ".weight"].sizes(), 2);
    tensors[stem + ".lora_down.weight"] = downs[diffusers] = at::randn(down_shape);
    tensors[stem + ".lora_up.weight"] = at::randn(up_shape);
  }
  sd::test::TempDir dir;
  io::save_safetensors(dir.path() / "ldm.safetensors", tensors);
  const LoraFileContents contents = load_lora_file(dir.path() / "ldm.safetensors", pipe);
  ASSERT_EQ(contents.adapters.size(), ldm_to_diffusers.size());
  for (const LoraModule& m : contents.adapters) {
    ASSERT_TRUE(downs.count(m.module)) << m.module;
    EXPECT_TRUE(at::equal(m.down, downs.at(m.module))) << m.module;
  }
}

TEST(LoraFile, BadFilesAreOneLineNamingTheFileAndKey) {
  sd::test::TempDir dir;
  StableDiffusion pipe = load_tiny();
  auto error_for = [&](const io::TensorMap& tensors) {
    const fs::path path = dir.path() / "bad.safetensors";
    io::save_safetensors(path, tensors);
    return sd::test::error_message([&] { apply_lora_files(pipe, {path.string()}, {}, false); });
  };
  const std::string file = (dir.path() / "bad.safetensors").string();
  const at::Tensor down = at::zeros({2, 32}), up = at::zeros({32, 2});
  EXPECT_EQ(error_for({{"unet." + kUNetModule + ".hada_w1_a", down}}),
            file + ": unknown key 'unet." + kUNetModule +
                ".hada_w1_a' (expected diffusers' unet.<module>.lora.down.weight or kohya's "
                "lora_unet_<module>.lora_down.weight, LyCORIS' .hada_w1_a (LoHa) or .lokr_w1 (LoKr), and their "
                "text-encoder, up and alpha twins)");
  const std::string stem = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q";
  EXPECT_EQ(
      error_for({{stem + ".scalar", at::scalar_tensor(1.0)}, {stem + ".alpha", at::scalar_tensor(1.0)}}),
      file + ": layer " + kUNetModule +
          ": 'scalar' is not read: sdtrain reads LoRA and LoCon (lora_down, lora_up, lora_mid), LoHa "
          "(hada_*), LoKr (lokr_*), full (diff, diff_b), IA3 (weight, on_input), OFT and BOFT (oft_blocks, "
          "oft_diag, rescale), GLoRA (a1.weight, ...) and norm (w_norm, b_norm) modules, with alpha and dora_scale");
  EXPECT_EQ(error_for({{"lora_unet_oft_blocks", down}}),
            file +
                ": unknown key 'lora_unet_oft_blocks' (expected diffusers' unet.<module>.lora.down.weight or kohya's "
                "lora_unet_<module>.lora_down.weight, LyCORIS' .hada_w1_a (LoHa) or .lokr_w1 (LoKr), and their "
                "text-encoder, up and alpha twins)");
  EXPECT_EQ(error_for({{"lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight", down}}),
            file +
                ": an SDXL LoRA (key 'lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight'); "
                "sdtrain runs SD-1.x and SD-2.x models");
  const std::string layer = file + ": layer " + kUNetModule;
  EXPECT_EQ(error_for({{stem + ".lora_down.weight", down},
                       {stem + ".lora_up.weight", up.index_fill(0, at::tensor(int64_t{3}), NAN)}}),
            file + ": tensor '" + stem +
                ".lora_up.weight' holds 2 NaN or infinite values (of 64): the weights are damaged or come from a "
                "diverged run");
  EXPECT_EQ(error_for({{stem + ".alpha", at::scalar_tensor(1.0)}}), layer + " has alpha but no weights");
  EXPECT_EQ(error_for({{stem + ".alpha", at::scalar_tensor(1.0)}, {stem + ".dora_scale", at::ones({32, 1})}}),
            layer + " has alpha and dora_scale but no weights");
  EXPECT_EQ(
      error_for(
          {{stem + ".lora_down.weight", down}, {stem + ".lora_up.weight", up}, {stem + ".dora_scale", at::ones({3})}}),
      layer + ": dora_scale [3] fits neither the layer's outputs [32, 1, ...] nor its inputs [1, 32, ...]");
  const std::string peft = "unet." + kUNetModule;
  EXPECT_EQ(error_for({{peft + ".lora_A.weight", down},
                       {peft + ".lora_B.weight", up},
                       {peft + ".lora_magnitude_vector", at::ones({1, 2})}}),
            layer + ": lora_magnitude_vector [1, 2] does not hold one norm per output of the layer's weight [32, 32]");
  EXPECT_EQ(error_for({{peft + ".lora_magnitude_vector", at::ones({32})}}),
            layer + " has lora_magnitude_vector but no weights");
  const std::string conv_stem = "lora_unet_down_blocks_1_resnets_0_conv1";
  EXPECT_EQ(error_for({{conv_stem + ".lora_down.weight", at::ones({2, 32, 1, 1})},
                       {conv_stem + ".lora_mid.weight", at::ones({2, 2, 3, 3})},
                       {conv_stem + ".lora_up.weight", at::ones({64, 3, 1, 1})}}),
            file +
                ": layer down_blocks.1.resnets.0.conv1: the LoRA factors down [2, 32, 1, 1], mid [2, 2, 3, 3], "
                "up [64, 3, 1, 1] do not make the layer's weight [64, 32, 3, 3]");
  EXPECT_EQ(error_for({{stem + ".lora_down.weight", down}, {stem + ".hada_w1_a", up}}),
            layer +
                " mixes the keys of LoRA (lora_down/lora_up), LoHa (hada_*), LoKr (lokr_*), full (diff), IA3 (weight), "
                "OFT (oft_blocks), GLoRA (a1.weight, ...) and norm (w_norm) modules");
  const std::string norm = "lora_unet_down_blocks_0_resnets_0_norm1",
                    norm_layer = file + ": layer down_blocks.0.resnets.0.norm1";
  EXPECT_EQ(error_for({{norm + ".b_norm", at::ones({32})}}),
            norm_layer + ": a norm module needs w_norm besides b_norm");
  EXPECT_EQ(error_for({{norm + ".w_norm", at::ones({31})}}),
            norm_layer + ": the Norm factors w_norm [31] do not make the layer's weight [32]");
  EXPECT_EQ(error_for({{norm + ".w_norm", at::ones({32})}, {norm + ".b_norm", at::ones({2, 32})}}),
            norm_layer + ": b_norm [2, 32] does not fit the layer's bias [32]");
  EXPECT_EQ(error_for({{stem + ".on_input", at::scalar_tensor(int64_t{1})}}),
            layer + ": an IA3 module needs weight besides on_input");
  EXPECT_EQ(error_for({{stem + ".weight", at::ones({31})}}),
            layer + ": the IA3 factors weight [31] do not make the layer's weight [32, 32]");
  EXPECT_EQ(
      error_for({{stem + ".a1.weight", up}, {stem + ".b2.weight", down}}),
      layer + ": a GLoRA module needs a1.weight, a2.weight, b1.weight and b2.weight; a2.weight, b1.weight missing");
  EXPECT_EQ(error_for({{stem + ".oft_blocks", at::zeros({2, 8, 8})}}),
            layer + ": the OFT factors oft_blocks [2, 8, 8] do not make the layer's weight [32, 32]");
  EXPECT_EQ(error_for({{stem + ".oft_blocks", at::zeros({2, 2, 8, 8})}}),
            layer + ": the OFT factors oft_blocks [2, 2, 8, 8] do not make the layer's weight [32, 32]");
  EXPECT_EQ(
      error_for({{stem + ".oft_blocks", at::zeros({2, 4, 8, 8})}, {stem + ".rescale", at::ones({31, 1})}}),
      layer + ": the OFT factors oft_blocks [2, 4, 8, 8], rescale [31, 1] do not make the layer's weight [32, 32]");
  EXPECT_EQ(error_for({{stem + ".rescale", at::ones({32, 1})}}),
            layer + ": an OFT module needs oft_blocks or (LyCORIS' early files) oft_diag, one of them");
  EXPECT_EQ(error_for({{stem + ".oft_blocks", at::zeros({4, 8, 8})}, {stem + ".oft_diag", at::zeros({4, 8, 8})}}),
            layer + ": an OFT module needs oft_blocks or (LyCORIS' early files) oft_diag, one of them");
  EXPECT_EQ(error_for({{stem + ".oft_diag", at::zeros({2, 2, 8, 8})}}),
            layer + ": the OFT factors oft_diag [2, 2, 8, 8] do not make the layer's weight [32, 32]");
  EXPECT_EQ(error_for({{stem + ".diff_b", at::ones({32})}}), layer + ": a full module needs diff besides diff_b");
  EXPECT_EQ(error_for({{stem + ".diff", at::ones({3, 3})}}),
            layer + ": the Full factors diff [3, 3] do not make the layer's weight [32, 32]");
  EXPECT_EQ(error_for({{stem + ".diff", at::ones({32, 32})}, {stem + ".diff_b", at::ones({32})}}),
            file + ": " + kUNetModule + ": a bias update for a layer without a bias");
  EXPECT_EQ(
      error_for({{stem + ".hada_w1_a", up}, {stem + ".hada_w1_b", down}}),
      layer + ": a LoHa module needs hada_w1_a, hada_w1_b, hada_w2_a and hada_w2_b; hada_w2_a, hada_w2_b missing");
  EXPECT_EQ(error_for({{stem + ".lokr_w1", at::ones({4, 4})}, {stem + ".lokr_w2_a", at::ones({8, 2})}}),
            layer + ": a LoKr module needs lokr_w2 or both lokr_w2_a and lokr_w2_b");
  EXPECT_EQ(error_for({{stem + ".lokr_w1", at::ones({4, 4})}, {stem + ".lokr_w2", at::ones({8, 4})}}),
            layer + ": the LoKr factors lokr_w1 [4, 4], lokr_w2 [8, 4] do not make the layer's weight [32, 32]");
  EXPECT_EQ(error_for({{stem + ".hada_w1_a", up},
                       {stem + ".hada_w1_b", down},
                       {stem + ".hada_w2_a", up},
                       {stem + ".hada_w2_b", at::ones({3, 32})}}),
            layer +
                ": the LoHa factors hada_w1_a [32, 2], hada_w1_b [2, 32], hada_w2_a [32, 2], hada_w2_b [3, 32] do "
                "not make the layer's weight [32, 32]");
  EXPECT_EQ(error_for({{"lora_unet_down_blocks_9_to_q.lora_down.weight", down}}),
            file +
                ": 'lora_unet_down_blocks_9_to_q.lora_down.weight': the UNet has no Linear, Conv2d or norm layer named "
                "lora_unet_down_blocks_9_to_q");
  EXPECT_EQ(error_for({{"unet." + kUNetModule + ".lora.down.weight", down}}),
            file + ": layer " + kUNetModule + " has a down weight but no up weight");
  EXPECT_EQ(error_for({{"unet.mid.to_q.lora.down.weight", down}, {"unet.mid.to_q.lora.up.weight", up}}),
            file + ": the UNet has no Linear or Conv2d layer 'mid.to_q'");
  EXPECT_EQ(
      error_for(
          {{"unet." + kUNetModule + ".lora.down.weight", down.t()}, {"unet." + kUNetModule + ".lora.up.weight", up}}),
      file + ": " + kUNetModule +
          ": LoRA down [32, 2] / up [32, 2] do not fit the layer's weight [32, 32] (expected down [32, 32], up [32, "
          "32])");
  EXPECT_EQ(sd::test::error_message([&] { load_lora_file(dir.path() / "missing.safetensors", pipe); }),
            (dir.path() / "missing.safetensors").string() + ": no such LoRA file");
  EXPECT_EQ(sd::test::error_message([&] {
              apply_lora_files(pipe, {"a", "b"}, {0.5}, false);
            }),
            "--lora_scale given 1 time(s) for 2 --lora file(s): give one scale per --lora, in the same order");
}

// The LyCORIS updates written out element by element from their definitions, independently of lora_file.cpp's
// products: Σ_r up[o, r]·down[r, i], and the Tucker form Σ_ab core[a, b, h, w]·up[a, o]·down[b, i].
at::Tensor product_by_elements(const at::Tensor& up, const at::Tensor& down) {
  const at::Tensor u = up.flatten(1), d = down.flatten(1);
  at::Tensor out = at::zeros({u.size(0), d.size(1)});
  for (int64_t o = 0; o < u.size(0); ++o)
    for (int64_t i = 0; i < d.size(1); ++i)
      for (int64_t r = 0; r < u.size(1); ++r) out[o][i] += u[o][r] * d[r][i];
  return out;
}

at::Tensor tucker_by_elements(const at::Tensor& core, const at::Tensor& up, const at::Tensor& down) {
  at::Tensor out = at::zeros({up.size(1), down.size(1), core.size(2), core.size(3)});
  for (int64_t a = 0; a < core.size(0); ++a)
    for (int64_t b = 0; b < core.size(1); ++b)
      out += core[a][b].reshape({1, 1, core.size(2), core.size(3)}) * up[a].reshape({-1, 1, 1, 1}) *
             down[b].reshape({1, -1, 1, 1});
  return out;
}

// kron(w1, w2)[i·p + k, j·q + l] = w1[i, j]·w2[k, l] (trailing kernel dimensions of w2 carried along).
at::Tensor kron_by_elements(const at::Tensor& w1, const at::Tensor& w2) {
  std::vector<int64_t> shape = w2.sizes().vec();
  shape[0] *= w1.size(0);
  shape[1] *= w1.size(1);
  at::Tensor out = at::zeros(shape);
  for (int64_t i = 0; i < w1.size(0); ++i)
    for (int64_t j = 0; j < w1.size(1); ++j)
      out.narrow(0, i * w2.size(0), w2.size(0)).narrow(1, j * w2.size(1), w2.size(1)).copy_(w1[i][j] * w2);
  return out;
}

// Layers the LyCORIS tests update, by kohya stem and module path: a UNet linear with a bias and a 3x3 conv.
const std::string kLinearStem = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_out_0";  // [32, 32]
const std::string kLinearModule = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_out.0";
const std::string kConv3x3Stem = "lora_unet_down_blocks_1_resnets_0_conv1";  // [64, 32, 3, 3]
const std::string kConv3x3Module = "down_blocks.1.resnets.0.conv1";

// tiny-sd1 with the LoRA file of tensors `t`, written to `path`, merged at `scale`.
StableDiffusion with_lora_file(const io::TensorMap& t, const fs::path& path, double scale) {
  io::save_safetensors(path, t);
  StableDiffusion pipe = load_tiny();
  apply_lora_files(pipe, {path.string()}, {scale}, /*fuse=*/false);
  return pipe;
}

// A copy of a layer's "weight" or "bias".
at::Tensor layer_weight(StableDiffusion& pipe, LoraComponent c, const std::string& module,
                        const std::string& name = "weight") {
  torch::nn::Module& model = c == LoraComponent::kUNet ? static_cast<torch::nn::Module&>(*pipe.unet)
                                                       : static_cast<torch::nn::Module&>(*pipe.text_encoder);
  return model.named_parameters()[module + "." + name].detach().clone();
}

TEST(LoraFile, LyCorisLoHaAndLoKrUpdateTheWeightsAsTheirDefinitions) {
  sd::test::TempDir dir;
  at::manual_seed(11);
  const std::string linear = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q";  // [32, 32]
  const std::string conv = "lora_unet_down_blocks_1_resnets_0_conv1";                                 // [64, 32, 3, 3]
  const std::string text = "lora_te_text_model_encoder_layers_0_self_attn_q_proj";                    // [32, 32]
  const std::string conv2 = "lora_unet_down_blocks_0_resnets_0_conv1";                                // [32, 32, 3, 3]
  io::TensorMap t = {
      // LoHa on a linear, rank 2 and 3 factors, alpha 1: multiplier alpha / rank(w1_b) = 1/2.
      {linear + ".hada_w1_a", at::randn({32, 2})},
      {linear + ".hada_w1_b", at::randn({2, 32})},
      {linear + ".hada_w2_a", at::randn({32, 3})},
      {linear + ".hada_w2_b", at::randn({3, 32})},
      {linear + ".alpha", at::scalar_tensor(1.0)},
      // LoHa on a 3x3 conv, both factors in Tucker form, no alpha: multiplier 1.
      {conv + ".hada_t1", at::randn({2, 2, 3, 3})},
      {conv + ".hada_w1_a", at::randn({2, 64})},
      {conv + ".hada_w1_b", at::randn({2, 32})},
      {conv + ".hada_t2", at::randn({2, 2, 3, 3})},
      {conv + ".hada_w2_a", at::randn({2, 64})},
      {conv + ".hada_w2_b", at::randn({2, 32})},
      // LoKr on the text encoder: whole w1 [4, 2], w2 = w2_a·w2_b [8, 16], alpha 3 over rank 2.
      {text + ".lokr_w1", at::randn({4, 2})},
      {text + ".lokr_w2_a", at::randn({8, 2})},
      {text + ".lokr_w2_b", at::randn({2, 16})},
      {text + ".alpha", at::scalar_tensor(3.0)},
      // LoKr on a 3x3 conv: w1 = w1_a·w1_b [4, 2], w2 in Tucker form [8, 16, 3, 3]; alpha 2 over rank(w2_b) = 4.
      {conv2 + ".lokr_w1_a", at::randn({4, 1})},
      {conv2 + ".lokr_w1_b", at::randn({1, 2})},
      {conv2 + ".lokr_t2", at::randn({4, 4, 3, 3})},
      {conv2 + ".lokr_w2_a", at::randn({4, 8})},
      {conv2 + ".lokr_w2_b", at::randn({4, 16})},
      {conv2 + ".alpha", at::scalar_tensor(2.0)},
  };
  const fs::path path = dir.path() / "lycoris.safetensors";
  io::save_safetensors(path, t);
  auto p = [&](const std::string& key) { return t.at(key); };
  struct Expected {
    LoraComponent component;
    std::string module;
    at::Tensor update;
  };
  const std::vector<Expected> expected = {
      {LoraComponent::kUNet, "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q",
       product_by_elements(p(linear + ".hada_w1_a"), p(linear + ".hada_w1_b")) *
           product_by_elements(p(linear + ".hada_w2_a"), p(linear + ".hada_w2_b")) * 0.5},
      {LoraComponent::kUNet, "down_blocks.1.resnets.0.conv1",
       tucker_by_elements(p(conv + ".hada_t1"), p(conv + ".hada_w1_a"), p(conv + ".hada_w1_b")) *
           tucker_by_elements(p(conv + ".hada_t2"), p(conv + ".hada_w2_a"), p(conv + ".hada_w2_b"))},
      {LoraComponent::kTextEncoder, "text_model.encoder.layers.0.self_attn.q_proj",
       kron_by_elements(p(text + ".lokr_w1"), product_by_elements(p(text + ".lokr_w2_a"), p(text + ".lokr_w2_b"))) *
           1.5},
      {LoraComponent::kUNet, "down_blocks.0.resnets.0.conv1",
       kron_by_elements(product_by_elements(p(conv2 + ".lokr_w1_a"), p(conv2 + ".lokr_w1_b")),
                        tucker_by_elements(p(conv2 + ".lokr_t2"), p(conv2 + ".lokr_w2_a"), p(conv2 + ".lokr_w2_b"))) *
           0.5},
  };

  StableDiffusion pipe = load_tiny();
  const LoraFileContents contents = load_lora_file(path, pipe);
  EXPECT_TRUE(contents.adapters.empty());
  ASSERT_EQ(contents.updates.size(), expected.size());
  std::vector<at::Tensor> before;
  for (const Expected& e : expected) before.push_back(layer_weight(pipe, e.component, e.module));
  apply_lora_files(pipe, {path.string()}, {0.7}, /*fuse=*/false);
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(expected[i].module);
    const at::Tensor after = layer_weight(pipe, expected[i].component, expected[i].module);
    ASSERT_EQ(after.sizes(), expected[i].update.sizes());
    EXPECT_TRUE(at::allclose(after - before[i], expected[i].update * 0.7, 1e-4, 1e-5));
  }
  EXPECT_TRUE(models::adapter_tensors(*pipe.unet).empty());  // merged, not attached
}

// Each slice of `w` along dimension `dim` (a row for 0, an input channel for 1) divided by its norm, and the norms,
// summed out by elements.
std::pair<at::Tensor, at::Tensor> directions_and_norms(const at::Tensor& w, int64_t dim) {
  std::vector<int64_t> others;
  for (int64_t d = 0; d < w.dim(); ++d)
    if (d != dim) others.push_back(d);
  const at::Tensor norms = (w * w).sum(others, /*keepdim=*/true).sqrt();
  return {w / norms, norms};
}

// LyCORIS' Tucker LoCon (lora_mid) written out by elements, a full update (diff, diff_b) added as it is, and DoRA
// (dora_scale) by what it is: at --lora_scale 1 the layer's weight has the directions of W + ΔW and the norms
// dora_scale holds, per output row ([out, 1]) or per input channel ([1, in, 1, 1]); below 1 it is that far along the
// way from W.
TEST(LoraFile, LyCorisTuckerLoConFullAndDoRAFollowTheirDefinitions) {
  sd::test::TempDir dir;
  at::manual_seed(12);
  const std::string conv = "lora_unet_down_blocks_1_resnets_0_conv1";                                 // [64, 32, 3, 3]
  const std::string linear = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q";  // [32, 32]
  const std::string loha = "lora_unet_down_blocks_0_resnets_0_conv1";                                 // [32, 32, 3, 3]
  const std::string full = "lora_unet_down_blocks_0_resnets_0_conv2";                                 // [32, 32, 3, 3]
  io::TensorMap t = {
      // A full update of weight and bias; its alpha is not used (LyCORIS' and A1111's full modules have no rank).
      {full + ".diff", at::randn({32, 32, 3, 3})},
      {full + ".diff_b", at::randn({32})},
      {full + ".alpha", at::scalar_tensor(5.0)},
      // Tucker LoCon, rank 2, alpha 1: multiplier 1/2.
      {conv + ".lora_down.weight", at::randn({2, 32, 1, 1})},
      {conv + ".lora_mid.weight", at::randn({2, 2, 3, 3})},
      {conv + ".lora_up.weight", at::randn({64, 2, 1, 1})},
      {conv + ".alpha", at::scalar_tensor(1.0)},
      // A DoRA LoRA on a linear, alpha 4 over rank 2: ΔW = 2·up·down; a norm for each output row.
      {linear + ".lora_down.weight", at::randn({2, 32}) * 0.1},
      {linear + ".lora_up.weight", at::randn({32, 2}) * 0.1},
      {linear + ".alpha", at::scalar_tensor(4.0)},
      {linear + ".dora_scale", at::rand({32, 1}) + 0.5},
      // A DoRA LoHa on a 3x3 conv, no alpha; a norm for each input channel.
      {loha + ".hada_w1_a", at::randn({32, 2}) * 0.1},
      {loha + ".hada_w1_b", at::randn({2, 288})},
      {loha + ".hada_w2_a", at::randn({32, 2}) * 0.1},
      {loha + ".hada_w2_b", at::randn({2, 288})},
      {loha + ".dora_scale", at::rand({1, 32, 1, 1}) + 0.5},
  };
  const fs::path path = dir.path() / "lycoris.safetensors";
  io::save_safetensors(path, t);
  auto p = [&](const std::string& key) { return t.at(key); };
  const std::string conv_module = "down_blocks.1.resnets.0.conv1",
                    linear_module = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q",
                    loha_module = "down_blocks.0.resnets.0.conv1";

  StableDiffusion base = load_tiny(), whole = load_tiny(), partial = load_tiny();
  apply_lora_files(whole, {path.string()}, {1.0}, /*fuse=*/false);
  apply_lora_files(partial, {path.string()}, {0.7}, /*fuse=*/false);
  auto weights = [&](const std::string& module) {
    return std::tuple{layer_weight(base, LoraComponent::kUNet, module),
                      layer_weight(whole, LoraComponent::kUNet, module),
                      layer_weight(partial, LoraComponent::kUNet, module)};
  };
  {
    SCOPED_TRACE("Tucker LoCon");
    const auto [w, w1, w07] = weights(conv_module);
    const at::Tensor update =
        tucker_by_elements(p(conv + ".lora_mid.weight"), p(conv + ".lora_up.weight").flatten(1).t(),
                           p(conv + ".lora_down.weight").flatten(1)) *
        0.5;
    EXPECT_TRUE(at::allclose(w07 - w, update * 0.7, 1e-4, 1e-5));
  }
  {
    SCOPED_TRACE("full");
    const std::string module = "down_blocks.0.resnets.0.conv2";
    const auto [w, w1, w07] = weights(module);
    EXPECT_TRUE(at::allclose(w07 - w, p(full + ".diff") * 0.7, 1e-5, 1e-6));
    const at::Tensor bias = layer_weight(base, LoraComponent::kUNet, module, "bias"),
                     bias07 = layer_weight(partial, LoraComponent::kUNet, module, "bias");
    EXPECT_TRUE(at::allclose(bias07 - bias, p(full + ".diff_b") * 0.7, 1e-5, 1e-6));
  }
  struct Dora {
    std::string module;
    int64_t dim;  // what dora_scale runs along: 0 output rows, 1 input channels
    at::Tensor update, dora_scale;
  };
  const std::vector<Dora> doras = {
      {linear_module, 0, product_by_elements(p(linear + ".lora_up.weight"), p(linear + ".lora_down.weight")) * 2.0,
       p(linear + ".dora_scale")},
      {loha_module, 1,
       (product_by_elements(p(loha + ".hada_w1_a"), p(loha + ".hada_w1_b")) *
        product_by_elements(p(loha + ".hada_w2_a"), p(loha + ".hada_w2_b")))
           .reshape({32, 32, 3, 3}),
       p(loha + ".dora_scale")},
  };
  for (const Dora& d : doras) {
    SCOPED_TRACE(d.module);
    const auto [w, w1, w07] = weights(d.module);
    const auto [directions, norms] = directions_and_norms(w1, d.dim);
    EXPECT_TRUE(at::allclose(directions, directions_and_norms(w + d.update, d.dim).first, 1e-4, 1e-6));
    EXPECT_TRUE(at::allclose(norms.flatten(), d.dora_scale.flatten(), 1e-5, 1e-6));
    EXPECT_TRUE(at::allclose(w07, w + (w1 - w) * 0.7, 1e-5, 1e-6));
  }
  EXPECT_TRUE(models::adapter_tensors(*whole.unet).empty());  // all merged, not attached
}

// LyCORIS' IA³ by its definition: each output row of the weight scaled by 1 + s·w (w: [out] for a linear, [1, out,
// 1, 1] for a conv), or with on_input 1 each input column; biases stay as they are.
TEST(LoraFile, LyCorisIA3ScalesTheWeightsRowsOrColumns) {
  sd::test::TempDir dir;
  at::manual_seed(3);
  const std::string &linear = kLinearStem, &conv = kConv3x3Stem;
  const std::string conv_out = "lora_unet_down_blocks_0_resnets_0_conv2";  // [32, 32, 3, 3]
  const io::TensorMap t = {
      {linear + ".weight", at::randn({32})},
      {linear + ".on_input", at::scalar_tensor(int64_t{0})},
      {conv + ".weight", at::randn({1, 32, 1, 1})},
      {conv + ".on_input", at::scalar_tensor(int64_t{1})},
      {conv_out + ".weight", at::randn({1, 32, 1, 1})},  // no on_input: on the outputs
  };
  const fs::path path = dir.path() / "ia3.safetensors";
  StableDiffusion base = load_tiny(), scaled = with_lora_file(t, path, 0.7);
  struct Case {
    std::string module, stem;
    bool on_input;
  };
  for (const Case& c : {Case{kLinearModule, linear, false}, Case{kConv3x3Module, conv, true},
                        Case{"down_blocks.0.resnets.0.conv2", conv_out, false}}) {
    SCOPED_TRACE(c.module);
    const at::Tensor w = layer_weight(base, LoraComponent::kUNet, c.module),
                     w07 = layer_weight(scaled, LoraComponent::kUNet, c.module);
    const at::Tensor scales = t.at(c.stem + ".weight").flatten();
    at::Tensor expected = w.clone();
    for (int64_t k = 0; k < scales.size(0); ++k) {
      at::Tensor slice = c.on_input ? expected.select(1, k) : expected.select(0, k);
      slice.mul_(1 + 0.7 * scales[k].item<double>());
    }
    EXPECT_TRUE(at::allclose(w07, expected, 1e-5, 1e-6));
    EXPECT_TRUE(at::equal(layer_weight(scaled, LoraComponent::kUNet, c.module, "bias"),
                          layer_weight(base, LoraComponent::kUNet, c.module, "bias")));
  }
  const std::optional<LoraFileSummary> summary = summarize_lora_file(path);
  ASSERT_TRUE(summary);
  ASSERT_EQ(summary->kinds.size(), 1u);
  EXPECT_EQ(summary->kinds.begin()->first, "IA3");
  EXPECT_EQ(summary->kinds.begin()->second.modules, 3);
}

// The orthogonal rotations (OFT, BOFT) of the tiny UNet's linear layer [32, 32] (`linear_blocks`, no alpha) and 3x3
// conv [64, 32, 3, 3] (`conv_blocks`, with alpha 1e-2: the bound 0.64 is far below ‖Q‖, and the conv's rescale if
// given), merged at --lora_scale 1 and 0.7, against `rotated(rows, q)`: the expected rows [out, in·kh·kw] (in double)
// for Q = B − Bᵀ of the blocks B, already scaled to the norm alpha · out. At 0.7 the weight is that far along the
// way, W + 0.7·(W' − W), as kohya's multiplier · (R − I) + I gives; biases stay. `rotated` checks what the rotation
// keeps (Gram matrices), the rescale applied after it. `sdtrain inspect`'s summary names both modules `kind`.
void expect_rotations_merged(const std::string& kind, const at::Tensor& linear_blocks, const at::Tensor& conv_blocks,
                             const std::optional<at::Tensor>& conv_rescale,
                             const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& rotated) {
  sd::test::TempDir dir;
  const std::string &linear = kLinearStem, &conv = kConv3x3Stem;
  io::TensorMap t = {{linear + ".oft_blocks", linear_blocks},
                     {conv + ".oft_blocks", conv_blocks},
                     {conv + ".alpha", at::scalar_tensor(1e-2)}};
  if (conv_rescale) t[conv + ".rescale"] = *conv_rescale;
  const fs::path path = dir.path() / "rotations.safetensors";
  StableDiffusion base = load_tiny(), whole = with_lora_file(t, path, 1.0), partial = with_lora_file(t, path, 0.7);
  struct Case {
    std::string module, stem;
    double bound;  // 0: none
  };
  for (const Case& c : {Case{kLinearModule, linear, 0}, Case{kConv3x3Module, conv, 1e-2 * 64}}) {
    SCOPED_TRACE(c.module);
    const at::Tensor w = layer_weight(base, LoraComponent::kUNet, c.module).to(at::kDouble),
                     w1 = layer_weight(whole, LoraComponent::kUNet, c.module).to(at::kDouble),
                     w07 = layer_weight(partial, LoraComponent::kUNet, c.module).to(at::kDouble);
    const at::Tensor blocks = t.at(c.stem + ".oft_blocks").to(at::kDouble);
    at::Tensor q = blocks - blocks.transpose(-1, -2);
    if (c.bound > 0) {
      ASSERT_GT(q.norm().item<double>(), c.bound);
      q = q * (c.bound / q.norm().item<double>());
    }
    at::Tensor rows = rotated(w.reshape({w.size(0), -1}), q);
    if (const auto rescale = t.find(c.stem + ".rescale"); rescale != t.end())
      rows = rows * rescale->second.to(at::kDouble).reshape({w.size(0), 1});
    const at::Tensor expected = rows.reshape(w.sizes());
    EXPECT_TRUE(at::allclose(w1, expected, 1e-4, 1e-6));
    EXPECT_TRUE(at::allclose(w07, w + (expected - w) * 0.7, 1e-4, 1e-6));
    EXPECT_TRUE(at::equal(layer_weight(partial, LoraComponent::kUNet, c.module, "bias"),
                          layer_weight(base, LoraComponent::kUNet, c.module, "bias")));
  }
  const std::optional<LoraFileSummary> summary = summarize_lora_file(path);
  ASSERT_TRUE(summary);
  ASSERT_EQ(summary->kinds.size(), 1u);
  EXPECT_EQ(summary->kinds.begin()->first, kind);
  EXPECT_EQ(summary->kinds.begin()->second.modules, 2);
}

// The Cayley rotation R = (I − Q)⁻¹(I + Q) of a skew-symmetric Q, in double (the other order than LyCORIS' (I + Q)
// (I − Q)⁻¹, which the transform allows).
at::Tensor cayley(const at::Tensor& q) {
  const at::Tensor eye = at::eye(q.size(0), at::kDouble);
  return at::linalg_solve(eye - q, eye + q);
}

// OFT (kohya's networks.oft, LyCORIS' diag-oft) by what it is: each block of n output rows is rotated,
// W'_k = R_kᵀ·W_k, so each block's Gram matrix W_kᵀ·W_k is kept.
TEST(LoraFile, OftRotatesBlocksOfOutputRows) {
  at::manual_seed(4);
  expect_rotations_merged("OFT", at::randn({4, 8, 8}) * 0.2, at::randn({8, 8, 8}), std::nullopt,
                          [](const at::Tensor& rows, const at::Tensor& q) {
                            const int64_t n = q.size(1);
                            at::Tensor out = rows.clone();
                            for (int64_t k = 0; k < q.size(0); ++k) {
                              const at::Tensor block = rows.slice(0, k * n, (k + 1) * n);
                              const at::Tensor turned = at::mm(cayley(q[k]).t(), block);
                              EXPECT_TRUE(at::allclose(at::mm(turned.t(), turned), at::mm(block.t(), block), 1e-9));
                              out.slice(0, k * n, (k + 1) * n).copy_(turned);
                            }
                            return out;
                          });
}

// BOFT (LyCORIS' boft) by its definition: oft_blocks [m, k, b, b] make m butterfly factors; factor i takes the output
// rows in groups of 2s (s = 2^i · b/2), row a·2s + g·s + j of a group going to place a·2s + 2j + g, rotates each run
// of b rows by its block's R (R·W_b, not OFT's transpose), and puts the rows back. Each factor is orthogonal, so
// W'ᵀ·W' = Wᵀ·W; LyCORIS' rescale then scales each output row.
TEST(LoraFile, BoftRotatesTheOutputRowsByButterflyFactors) {
  at::manual_seed(5);
  // 32 rows: two factors of four 8x8 blocks; 64 rows: three factors of sixteen 4x4 blocks.
  expect_rotations_merged(
      "BOFT", at::randn({2, 4, 8, 8}) * 0.2, at::randn({3, 16, 4, 4}), 1 + at::randn({64, 1, 1, 1}) * 0.1,
      [](const at::Tensor& rows, const at::Tensor& q) {
        const int64_t b = q.size(2), out = rows.size(0);
        at::Tensor turned = rows.clone();
        for (int64_t i = 0; i < q.size(0); ++i) {
          const int64_t s = (int64_t{1} << i) * (b / 2);
          std::vector<int64_t> from(out);  // place p of the interleaved order holds row from[p]
          for (int64_t a = 0; a < out / (2 * s); ++a)
            for (int64_t g = 0; g < 2; ++g)
              for (int64_t j = 0; j < s; ++j) from[a * 2 * s + 2 * j + g] = a * 2 * s + g * s + j;
          const at::Tensor order = at::tensor(from), interleaved = turned.index_select(0, order);
          at::Tensor rotated = at::empty_like(interleaved);
          for (int64_t block = 0; block < out / b; ++block)
            rotated.slice(0, block * b, (block + 1) * b)
                .copy_(at::mm(cayley(q[i][block]), interleaved.slice(0, block * b, (block + 1) * b)));
          turned.index_copy_(0, order, rotated);
        }
        EXPECT_TRUE(at::allclose(at::mm(turned.t(), turned), at::mm(rows.t(), rows), 1e-9));
        return turned;
      });
}

// LyCORIS' early OFT by what it saved: oft_diag [k, n, n] holds the rotations R themselves (a rescale folded in, so
// not orthogonal), each block of n output rows turned to R_kᵀ·W_k; an alpha (the constraint, applied before saving)
// changes nothing. Merged at --lora_scale 0.7, W + 0.7·(W' − W).
TEST(LoraFile, EarlyOftAppliesItsStoredRotations) {
  sd::test::TempDir dir;
  at::manual_seed(7);
  const std::string &linear = kLinearStem, &conv = kConv3x3Stem;
  const io::TensorMap t = {{linear + ".oft_diag", at::eye(8).expand({4, 8, 8}) + at::randn({4, 8, 8}) * 0.1},
                           {conv + ".oft_diag", at::eye(8).expand({8, 8, 8}) + at::randn({8, 8, 8}) * 0.1},
                           {conv + ".alpha", at::scalar_tensor(1e-2)}};
  StableDiffusion base = load_tiny(), partial = with_lora_file(t, dir.path() / "oft_diag.safetensors", 0.7);
  for (const auto& [module, stem] : {std::pair{kLinearModule, linear}, std::pair{kConv3x3Module, conv}}) {
    SCOPED_TRACE(module);
    const at::Tensor w = layer_weight(base, LoraComponent::kUNet, module),
                     w07 = layer_weight(partial, LoraComponent::kUNet, module);
    const at::Tensor r = t.at(stem + ".oft_diag"), rows = w.reshape({w.size(0), -1});
    at::Tensor expected = rows.clone();
    for (int64_t k = 0; k < r.size(0); ++k)
      expected.slice(0, k * 8, (k + 1) * 8).copy_(at::mm(r[k].t(), rows.slice(0, k * 8, (k + 1) * 8)));
    EXPECT_TRUE(at::allclose(w07, w + (expected.reshape(w.sizes()) - w) * 0.7, 1e-4, 1e-6));
  }
}

// GLoRA (LyCORIS' glora) by its definition, ΔW = (W·(a1·a2) + b1·b2) · alpha / rank: the layer's input channels
// mixed by a1·a2 (Σ_j W[o, j, ...]·M[j, i]), plus a LoCon's product; merged at --lora_scale 0.7.
TEST(LoraFile, GLoRAMixesTheInputsAndAddsALowRankProduct) {
  sd::test::TempDir dir;
  at::manual_seed(6);
  const std::string &linear = kLinearStem, &conv = kConv3x3Stem;
  const io::TensorMap t = {
      {linear + ".a1.weight", at::randn({32, 4}) * 0.1}, {linear + ".a2.weight", at::randn({4, 32}) * 0.1},
      {linear + ".b1.weight", at::randn({32, 4}) * 0.1}, {linear + ".b2.weight", at::randn({4, 32}) * 0.1},
      {linear + ".alpha", at::scalar_tensor(2.0)},  // alpha / rank = 1/2
      {conv + ".a1.weight", at::randn({32, 2, 1, 1})},   {conv + ".a2.weight", at::randn({2, 32, 1, 1})},
      {conv + ".b1.weight", at::randn({64, 2, 1, 1})},   {conv + ".b2.weight", at::randn({2, 32, 3, 3})},
  };
  StableDiffusion base = load_tiny(), partial = with_lora_file(t, dir.path() / "glora.safetensors", 0.7);
  struct Case {
    std::string module, stem;
    double multiplier;
  };
  for (const Case& c : {Case{kLinearModule, linear, 0.5}, Case{kConv3x3Module, conv, 1.0}}) {
    SCOPED_TRACE(c.module);
    const at::Tensor w = layer_weight(base, LoraComponent::kUNet, c.module),
                     w07 = layer_weight(partial, LoraComponent::kUNet, c.module);
    const at::Tensor mix = product_by_elements(t.at(c.stem + ".a1.weight"), t.at(c.stem + ".a2.weight"));
    std::vector<int64_t> row(w.dim(), 1);
    row[1] = -1;
    at::Tensor mixed = at::zeros_like(w);
    for (int64_t j = 0; j < w.size(1); ++j) mixed += w.narrow(1, j, 1) * mix[j].reshape(row);
    const at::Tensor update =
        (mixed + product_by_elements(t.at(c.stem + ".b1.weight"), t.at(c.stem + ".b2.weight")).reshape(w.sizes())) *
        c.multiplier;
    EXPECT_TRUE(at::allclose(w07 - w, update * 0.7, 1e-4, 1e-5));
  }
}

// LyCORIS' norm modules by their definition: a GroupNorm's or LayerNorm's weight += s·w_norm and bias += s·b_norm,
// under diffusers' module names or (UNet) the original LDM ones; UNet and text encoder alike.
TEST(LoraFile, NormModulesAddToTheNormLayersWeightAndBias) {
  sd::test::TempDir dir;
  at::manual_seed(8);
  const io::TensorMap t = {
      {"lora_unet_down_blocks_0_resnets_0_norm1.w_norm", at::randn({32})},  // GroupNorm
      {"lora_unet_down_blocks_0_resnets_0_norm1.b_norm", at::randn({32})},
      {"lora_unet_output_blocks_0_0_in_layers_0.w_norm", at::randn({128})},  // LDM name of up_blocks.0.resnets.0.norm1
      {"lora_te_text_model_encoder_layers_0_layer_norm1.w_norm", at::randn({32})},  // LayerNorm, weight only
  };
  const fs::path path = dir.path() / "norm.safetensors";
  StableDiffusion base = load_tiny(), scaled = with_lora_file(t, path, 0.7);
  struct Case {
    LoraComponent component;
    std::string module, w_norm, b_norm;
  };
  for (const Case& c :
       {Case{LoraComponent::kUNet, "down_blocks.0.resnets.0.norm1", "lora_unet_down_blocks_0_resnets_0_norm1.w_norm",
             "lora_unet_down_blocks_0_resnets_0_norm1.b_norm"},
        Case{LoraComponent::kUNet, "up_blocks.0.resnets.0.norm1", "lora_unet_output_blocks_0_0_in_layers_0.w_norm", ""},
        Case{LoraComponent::kTextEncoder, "text_model.encoder.layers.0.layer_norm1",
             "lora_te_text_model_encoder_layers_0_layer_norm1.w_norm", ""}}) {
    SCOPED_TRACE(c.module);
    const at::Tensor w = layer_weight(base, c.component, c.module), w07 = layer_weight(scaled, c.component, c.module);
    EXPECT_TRUE(at::allclose(w07, w + t.at(c.w_norm) * 0.7, 1e-6, 1e-7));
    const at::Tensor b = layer_weight(base, c.component, c.module, "bias"),
                     b07 = layer_weight(scaled, c.component, c.module, "bias");
    EXPECT_TRUE(c.b_norm.empty() ? at::equal(b07, b) : at::allclose(b07, b + t.at(c.b_norm) * 0.7, 1e-6, 1e-7));
  }
  const std::optional<LoraFileSummary> summary = summarize_lora_file(path);
  ASSERT_TRUE(summary);
  EXPECT_EQ(summary->kinds.at("Norm").modules, 3);
}

// peft's DoRA as diffusers saves it (lora_magnitude_vector beside the LoRA's factors, diffusers' or peft's names) by
// what peft computes: the layer's weight has the directions of W + s·ΔW and the magnitudes as its output rows' norms,
// the strength s inside the norm, so even at s = 0 the weight is rescaled.
TEST(LoraFile, PeftDoRAFollowsPeftsDefinitionAtEveryScale) {
  sd::test::TempDir dir;
  at::manual_seed(13);
  const std::string conv = "down_blocks.1.resnets.0.conv1";  // [64, 32, 3, 3]
  io::TensorMap t = {
      {"unet." + kUNetModule + ".lora.down.weight", at::randn({2, 32}) * 0.1},
      {"unet." + kUNetModule + ".lora.up.weight", at::randn({32, 2}) * 0.1},
      {"unet." + kUNetModule + ".lora_magnitude_vector", at::rand({32}) + 0.5},
      {"unet." + conv + ".lora_A.weight", at::randn({2, 32, 3, 3}) * 0.1},
      {"unet." + conv + ".lora_B.weight", at::randn({64, 2, 1, 1}) * 0.1},
      {"unet." + conv + ".lora_magnitude_vector", at::rand({1, 64, 1, 1}) + 0.5},
      {"text_encoder." + kTextModule + ".lora_linear_layer.down.weight", at::randn({2, 32}) * 0.1},
      {"text_encoder." + kTextModule + ".lora_linear_layer.up.weight", at::randn({32, 2}) * 0.1},
      {"text_encoder." + kTextModule + ".lora_magnitude_vector", at::rand({32}) + 0.5},
  };
  const fs::path path = dir.path() / "dora.safetensors";
  io::save_safetensors(path, t);
  struct Layer {
    LoraComponent component;
    std::string module, down, up, magnitude;
  };
  const std::vector<Layer> layers = {
      {LoraComponent::kUNet, kUNetModule, "unet." + kUNetModule + ".lora.down.weight",
       "unet." + kUNetModule + ".lora.up.weight", "unet." + kUNetModule + ".lora_magnitude_vector"},
      {LoraComponent::kUNet, conv, "unet." + conv + ".lora_A.weight", "unet." + conv + ".lora_B.weight",
       "unet." + conv + ".lora_magnitude_vector"},
      {LoraComponent::kTextEncoder, kTextModule, "text_encoder." + kTextModule + ".lora_linear_layer.down.weight",
       "text_encoder." + kTextModule + ".lora_linear_layer.up.weight",
       "text_encoder." + kTextModule + ".lora_magnitude_vector"},
  };
  StableDiffusion base = load_tiny();
  for (double scale : {1.0, 0.6, 0.0}) {
    StableDiffusion pipe = load_tiny();
    apply_lora_files(pipe, {path.string()}, {scale}, /*fuse=*/false);
    for (const Layer& l : layers) {
      SCOPED_TRACE(l.module + " at scale " + std::to_string(scale));
      const at::Tensor w = layer_weight(base, l.component, l.module), after = layer_weight(pipe, l.component, l.module);
      const at::Tensor update = product_by_elements(t.at(l.up), t.at(l.down)).reshape(w.sizes());
      const auto [directions, norms] = directions_and_norms(after, 0);
      EXPECT_TRUE(at::allclose(directions, directions_and_norms(w + update * scale, 0).first, 1e-4, 1e-6));
      EXPECT_TRUE(at::allclose(norms.flatten(), t.at(l.magnitude).flatten(), 1e-5, 1e-6));
    }
    EXPECT_TRUE(models::adapter_tensors(*pipe.unet).empty());  // merged, not attached
  }
}

}  // namespace
}  // namespace sd::pipeline
