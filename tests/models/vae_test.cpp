#include "models/vae/autoencoder_kl.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "model_test_util.h"
#include "models/weights.h"

namespace sd::models {
namespace {

using sd::test::error_message;
using sd::test::fixtures;
using sd::test::golden;
using sd::test::matches_golden;
using sd::test::TempDir;

// C2: encode (posterior mean, clamped logvar, std) and decode against diffusers.
void check_vae_golden(const std::string& pipeline) {
  torch::NoGradGuard no_grad;
  AutoencoderKL vae = load_vae(fixtures() / pipeline / "vae");
  auto g = io::load_safetensors(golden(pipeline + "/vae.safetensors"));
  DiagonalGaussian dist = vae->encode(g.at("input.image"));
  EXPECT_TRUE(matches_golden(pipeline + " encode.mean", dist.mean, g.at("encode.mean"), 1e-4));
  EXPECT_TRUE(matches_golden(pipeline + " encode.logvar", dist.logvar, g.at("encode.logvar"), 1e-4));
  EXPECT_TRUE(matches_golden(pipeline + " encode.std", dist.std, g.at("encode.std"), 1e-4));
  EXPECT_TRUE(at::allclose(dist.var, dist.std * dist.std, 1e-5, 0));
  EXPECT_TRUE(
      matches_golden(pipeline + " decode.sample", vae->decode(g.at("input.latents")), g.at("decode.sample"), 1e-4));
}

TEST(VaeGolden, TinySd1MatchesDiffusers) { check_vae_golden("tiny-sd1"); }
TEST(VaeGolden, TinySd2MatchesDiffusers) { check_vae_golden("tiny-sd2"); }

TEST(Vae, PosteriorSamplesFromEpsOrGenerator) {
  at::Tensor moments = at::randn({2, 8, 4, 4}) * 20;  // large enough to hit both logvar clamps
  DiagonalGaussian d = DiagonalGaussian::from_moments(moments);
  EXPECT_LE(d.logvar.max().item<double>(), 20.0);
  EXPECT_GE(d.logvar.min().item<double>(), -30.0);
  EXPECT_TRUE(at::equal(d.mode(), moments.slice(1, 0, 4)));
  at::Tensor eps = at::randn({2, 4, 4, 4});
  EXPECT_TRUE(at::equal(d.sample(eps), d.mean + d.std * eps));
  at::Generator g1 = at::make_generator<at::CPUGeneratorImpl>(42);
  at::Generator g2 = at::make_generator<at::CPUGeneratorImpl>(42);
  at::Tensor s1 = d.sample(g1);
  EXPECT_TRUE(at::equal(s1, d.sample(g2)));
  EXPECT_FALSE(at::equal(s1, d.sample(g1)));
  EXPECT_NE(error_message([&] { d.sample(at::randn({2, 4, 4, 3})); }), "");
}

TEST(VaeBf16, RunsWithAllWeightsInBf16CloseToFloat32) {
  torch::NoGradGuard no_grad;
  AutoencoderKL vae = load_vae(fixtures() / "tiny-sd1" / "vae", at::kBFloat16);
  auto g = io::load_safetensors(golden("tiny-sd1/vae.safetensors"));
  DiagonalGaussian dist = vae->encode(g.at("input.image").to(at::kBFloat16));
  at::Tensor decoded = vae->decode(g.at("input.latents").to(at::kBFloat16));
  ASSERT_EQ(dist.mean.scalar_type(), at::kBFloat16);
  ASSERT_EQ(decoded.scalar_type(), at::kBFloat16);
  const double mean_err = sd::test::rel_l2(dist.mean, g.at("encode.mean"));
  const double std_err = sd::test::rel_l2(dist.std, g.at("encode.std"));
  const double dec_err = sd::test::rel_l2(decoded, g.at("decode.sample"));
  std::cout << "  [ratio] bf16 VAE rel_l2: mean " << mean_err << ", std " << std_err << ", decode " << dec_err << "\n";
  EXPECT_LT(mean_err, sd::test::bf16_tolerance(5e-2));
  EXPECT_LT(std_err, sd::test::bf16_tolerance(5e-2));
  EXPECT_LT(dec_err, sd::test::bf16_tolerance(5e-2));
}

TEST(VaeLoading, Bf16FileLoadsIntoFloat32) {
  TempDir tmp;
  sd::test::write_edited_component(tmp.path(), "tiny-sd2", "vae", [](io::TensorMap& w) {
    for (auto& [name, t] : w) t = t.to(at::kBFloat16);
  });
  const auto src = io::load_safetensors(fixtures() / "tiny-sd2" / "vae" / "diffusion_pytorch_model.safetensors");
  AutoencoderKL vae = load_vae(tmp.path(), at::kFloat);
  for (const auto& [name, value] : named_weights(*vae)) {
    ASSERT_EQ(value.scalar_type(), at::kFloat) << name;
    ASSERT_TRUE(at::equal(value, src.at(name).to(at::kBFloat16).to(at::kFloat))) << name;
  }
}

TEST(VaeLoading, WrongShapeMissingKeyAndMissingFileNameFileAndKey) {
  TempDir tmp;
  sd::test::write_edited_component(tmp.path(), "tiny-sd1", "vae", [](io::TensorMap& w) {
    w["decoder.mid_block.attentions.0.to_q.weight"] = at::zeros({64, 32});
    w.erase("quant_conv.bias");
  });
  const auto file = (tmp.path() / "diffusion_pytorch_model.safetensors").string();
  std::string msg = error_message([&] { load_vae(tmp.path()); });
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_NE(msg.find("decoder.mid_block.attentions.0.to_q.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("quant_conv.bias"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;

  // tiny-sd2's VAE has one resnet per block fewer: its weights do not fit tiny-sd1's config.
  std::filesystem::copy_file(fixtures() / "tiny-sd2" / "vae" / "diffusion_pytorch_model.safetensors", file,
                             std::filesystem::copy_options::overwrite_existing);
  msg = error_message([&] { load_vae(tmp.path()); });
  EXPECT_NE(msg.find("missing keys: "), std::string::npos) << msg;

  std::filesystem::remove(file);
  msg = error_message([&] { load_vae(tmp.path()); });
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
}

TEST(VaeParameters, CountFromConfigMatchesModulesAndSdIsExact) {
  for (const std::string pipeline : {"tiny-sd1", "tiny-sd2"}) {
    VaeConfig c = VaeConfig::load((fixtures() / pipeline / "vae" / "config.json").string());
    AutoencoderKL vae(c);
    EXPECT_EQ(count_parameters(c), parameter_count(*vae));
  }
  VaeConfig v;
  v.block_out_channels = {32, 64};
  v.down_block_types.assign(2, "DownEncoderBlock2D");
  v.up_block_types.assign(2, "UpDecoderBlock2D");
  v.latent_channels = 16;
  v.in_channels = 1;
  v.layers_per_block = 3;
  AutoencoderKL vae(v);
  EXPECT_EQ(count_parameters(v), parameter_count(*vae));
  EXPECT_EQ(count_parameters(VaeConfig::sd()), 83653863);
}

}  // namespace
}  // namespace sd::models
