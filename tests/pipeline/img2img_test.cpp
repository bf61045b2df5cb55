// img2img as diffusers 0.24's StableDiffusionImg2ImgPipeline computes it, on tiny-sd1 (no golden exists: each
// part is checked against the formula it implements): VaeImageProcessor's preprocessing (size rounded down to the
// VAE factor with PIL's Lanczos filter, pixels to [-1, 1]), get_timesteps' table tail, and the starting latents
// add_noise(scaling_factor * (mean + std * eps_k), noise_k, t_start) with eps_k and noise_k image k's first two
// draws.
#include "pipeline/img2img.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/error.h"
#include "models/model_test_util.h"
#include "schedulers/factory.h"
#include "test_util.h"

namespace sd::pipeline {
namespace {

using sd::test::error_message;
using sd::test::matches_golden;

StableDiffusion& tiny_sd1() {
  static StableDiffusion pipe = load_pipeline(sd::test::fixtures() / "tiny-sd1");
  return pipe;
}

// A deterministic, busy test pattern.
io::RgbImage pattern(int width, int height) {
  io::RgbImage image{width, height, std::vector<uint8_t>(static_cast<size_t>(width) * height * 3)};
  for (size_t i = 0; i < image.pixels.size(); ++i) image.pixels[i] = static_cast<uint8_t>((i * 37 + i / 7) % 256);
  return image;
}

double lanczos3(double x) {
  auto sinc = [](double v) { return v == 0 ? 1.0 : std::sin(M_PI * v) / (M_PI * v); };
  return std::abs(x) < 3 ? sinc(x) * sinc(x / 3) : 0.0;
}

// PIL's antialiased resampling along one axis in float64 (support 3 x the downscale factor, weights normalized
// to sum 1), rounded and clamped to 0..255 after the pass as PIL does for 8-bit images.
std::vector<double> resample_line(const std::vector<double>& in, int out_size) {
  const double scale = static_cast<double>(in.size()) / out_size, filter_scale = std::max(scale, 1.0);
  std::vector<double> out;
  for (int x = 0; x < out_size; ++x) {
    const double center = (x + 0.5) * scale;
    double sum = 0, total = 0;
    for (int i = 0; i < static_cast<int>(in.size()); ++i) {
      const double w = lanczos3((i + 0.5 - center) / filter_scale);
      sum += w * in[i];
      total += w;
    }
    out.push_back(std::clamp(std::round(sum / total), 0.0, 255.0));
  }
  return out;
}

TEST(Img2ImgPreprocess, LanczosResizeIsPilsFilterWithinOneLevel) {
  const io::RgbImage image = pattern(70, 45);
  const io::RgbImage resized = io::resize(image, 52, 31, io::ResizeFilter::kLanczos);
  ASSERT_EQ(resized.width, 52);
  ASSERT_EQ(resized.height, 31);
  int worst = 0;
  for (int ch = 0; ch < 3; ++ch) {
    // Horizontal pass first, then vertical, as PIL.
    std::vector<std::vector<double>> rows;
    for (int y = 0; y < image.height; ++y) {
      std::vector<double> line;
      for (int x = 0; x < image.width; ++x) line.push_back(image.row(y)[x * 3 + ch]);
      rows.push_back(resample_line(line, 52));
    }
    for (int x = 0; x < 52; ++x) {
      std::vector<double> column;
      for (int y = 0; y < image.height; ++y) column.push_back(rows[y][x]);
      const std::vector<double> expected = resample_line(column, 31);
      for (int y = 0; y < 31; ++y)
        worst = std::max(worst, static_cast<int>(std::abs(resized.row(y)[x * 3 + ch] - expected[y])));
    }
  }
  EXPECT_LE(worst, 1);
}

TEST(Img2ImgPreprocess, RoundsDownToTheVaeFactorAndMapsPixelsToMinusOneOne) {
  const io::RgbImage image = pattern(70, 45);
  const at::Tensor pre = preprocess_image(image, 4);
  ASSERT_EQ(pre.sizes(), at::IntArrayRef({1, 3, 44, 68}));
  EXPECT_EQ(pre.scalar_type(), at::kFloat);
  const io::RgbImage resized = io::resize(image, 68, 44, io::ResizeFilter::kLanczos);
  for (const auto& [y, x, ch] : std::vector<std::tuple<int, int, int>>{{0, 0, 0}, {43, 67, 2}, {20, 31, 1}}) {
    const float expected = static_cast<float>(resized.row(y)[x * 3 + ch]) / 255.0f * 2.0f - 1.0f;
    EXPECT_EQ(pre[0][ch][y][x].item<float>(), expected);
  }
  // A size that is already a multiple is kept as it is (PIL returns a copy).
  const io::RgbImage exact = pattern(64, 48);
  const at::Tensor kept = preprocess_image(exact, 8);
  EXPECT_EQ(kept[0][1][5][7].item<float>(), static_cast<float>(exact.row(5)[7 * 3 + 1]) / 255.0f * 2.0f - 1.0f);
  EXPECT_NE(error_message([] { preprocess_image(pattern(3, 20), 4); }).find("smaller than 4 pixels"),
            std::string::npos);
}

// get_timesteps: int(n * strength) steps run, the table's first (n - that) x order entries are skipped.
TEST(Img2ImgTimesteps, SkipTheFirstStepsOfTheTable) {
  const StableDiffusion& pipe = tiny_sd1();
  auto ddim = schedulers::make_scheduler(pipe.scheduler_config, "ddim");
  ddim->set_timesteps(10);
  EXPECT_TRUE(at::equal(img2img_timesteps(*ddim, 10, 0.5), at::tensor({401, 301, 201, 101, 1}, at::kLong)));
  EXPECT_TRUE(at::equal(img2img_timesteps(*ddim, 10, 1.0), ddim->timesteps()));
  EXPECT_EQ(img2img_timesteps(*ddim, 10, 0.7).size(0), 7);  // int(10 * 0.7) = 7
  EXPECT_EQ(img2img_timesteps(*ddim, 10, 0.19).size(0), 1);
  // PNDM's table repeats its second entry: [751, 501, 501, 251, 1][2:].
  auto pndm = schedulers::make_scheduler(pipe.scheduler_config);
  pndm->set_timesteps(4);
  EXPECT_TRUE(at::equal(img2img_timesteps(*pndm, 4, 0.5), at::tensor({501, 251, 1}, at::kLong)));
  // Heun (order 2) skips two entries per step: [751, 501, 501, 251, 251, 1, 1][4:].
  auto heun = schedulers::make_scheduler(pipe.scheduler_config, "heun");
  heun->set_timesteps(4);
  EXPECT_TRUE(at::equal(img2img_timesteps(*heun, 4, 0.5), at::tensor({251.0f, 1.0f, 1.0f})));
}

TEST(Img2Img, StartsFromEachImagesNoisedVaeSample) {
  StableDiffusion& pipe = tiny_sd1();
  Img2ImgOptions o;
  o.prompts = {"a red cube"};
  o.num_images_per_prompt = 2;
  o.num_inference_steps = 4;
  o.strength = 0.5;
  o.seed = 21;
  o.init_image = pattern(66, 70);  // -> 64x68, latents 16x17
  for (const std::string name : {"ddim", "euler", "dpm++"}) {
    SCOPED_TRACE(name);
    auto scheduler = schedulers::make_scheduler(pipe.scheduler_config, name);
    std::vector<DenoisingStep> steps;
    GenerationHooks hooks;
    hooks.on_step = [&](const DenoisingStep& s) { steps.push_back(s); };
    const GenerationResult result = img2img(pipe, *scheduler, o, hooks);
    EXPECT_EQ(result.images.sizes(), at::IntArrayRef({2, 68, 64, 3}));
    EXPECT_EQ(result.seeds, (std::vector<uint64_t>{21, 22}));
    const at::Tensor expected_timesteps = img2img_timesteps(*scheduler, 4, 0.5);
    ASSERT_EQ(steps.size(), 2u);
    EXPECT_TRUE(at::equal(steps[0].timestep, expected_timesteps[0]));

    // The starting latents, rebuilt from the formula with fresh generators.
    auto reference = schedulers::make_scheduler(pipe.scheduler_config, name);
    reference->set_timesteps(4);
    const models::DiagonalGaussian posterior = pipe.vae->encode(preprocess_image(o.init_image, 4));
    std::vector<at::Generator> generators = image_generators(21, 2);
    std::vector<at::Tensor> clean;
    for (auto& g : generators) clean.push_back(posterior.mean + posterior.std * at::randn({1, 4, 17, 16}, g));
    const at::Tensor x0 = at::cat(clean) * pipe.vae->scaling_factor();
    const at::Tensor noise = randn_per_image(generators, {4, 17, 16});
    const at::Tensor start = reference->add_noise(x0, noise, expected_timesteps.slice(0, 0, 1).repeat({2}));
    const at::Tensor scaled = reference->scale_model_input(start, expected_timesteps[0]);
    EXPECT_TRUE(matches_golden("step 0 UNet input (cond half)", steps[0].unet_input.slice(0, 2), scaled, 1e-5));
    EXPECT_TRUE(matches_golden("step 0 UNet input (uncond half)", steps[0].unet_input.slice(0, 0, 2), scaled, 1e-5));
  }
}

TEST(Img2Img, RejectsBadStrength) {
  StableDiffusion& pipe = tiny_sd1();
  auto scheduler = schedulers::make_scheduler(pipe.scheduler_config);
  Img2ImgOptions o;
  o.prompts = {"a red cube"};
  o.num_inference_steps = 4;
  o.init_image = pattern(64, 64);
  auto message = [&](double strength) {
    Img2ImgOptions bad = o;
    bad.strength = strength;
    return error_message([&] { img2img(pipe, *scheduler, bad); });
  };
  EXPECT_NE(message(0).find("strength must be in (0, 1], got 0"), std::string::npos) << message(0);
  EXPECT_NE(message(1.5).find("strength must be in (0, 1], got 1.5"), std::string::npos) << message(1.5);
  EXPECT_NE(message(0.2).find("runs no step"), std::string::npos) << message(0.2);
}

}  // namespace
}  // namespace sd::pipeline
