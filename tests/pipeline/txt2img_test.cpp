// txt2img parity with diffusers 0.24's StableDiffusionPipeline on tiny-sd1 (fixtures README C8): the conditioning,
// every step's UNet input/output and latents, the decoded image and its uint8 pixels; plus the seeding contract,
// guidance off, guidance_rescale and DDIM's eta (replayed from the formulas, no golden has them), bf16 and the
// input checks of the library call.
#include "pipeline/txt2img.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <iostream>

#include "core/error.h"
#include "io/safetensors.h"
#include "models/model_test_util.h"
#include "pipeline/prompt_encoding.h"
#include "schedulers/ddim.h"
#include "schedulers/factory.h"
#include "test_util.h"

namespace sd::pipeline {
namespace {

using sd::test::error_message;
using sd::test::matches_golden;

constexpr double kTol = 1e-4;  // README: txt2img latents and images
const char* kPrompt = "a photo of an astronaut riding a horse";

StableDiffusion& tiny_sd1() {
  static StableDiffusion pipe = load_pipeline(sd::test::fixtures() / "tiny-sd1");
  return pipe;
}

struct GoldenRun {
  GenerationResult result;
  std::vector<DenoisingStep> steps;
  at::Tensor scheduler_timesteps;
};

GoldenRun run_golden_setup(StableDiffusion& pipe, const std::optional<std::string>& scheduler_name,
                           const at::Tensor& latents) {
  auto scheduler = schedulers::make_scheduler(pipe.scheduler_config, scheduler_name);
  Txt2ImgOptions o;
  o.prompts = {kPrompt};
  o.num_inference_steps = 4;
  o.guidance_scale = 7.5;
  o.initial_latents = latents;
  GoldenRun run;
  GenerationHooks hooks;
  hooks.on_step = [&run](const DenoisingStep& s) { run.steps.push_back(s); };
  run.result = txt2img(pipe, *scheduler, o, hooks);
  run.scheduler_timesteps = scheduler->timesteps();
  return run;
}

// Every pixel within ±1 level (README's image_uint8 rule).
::testing::AssertionResult within_one_level(const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.sizes() != expected.sizes()) return ::testing::AssertionFailure() << "shape mismatch";
  const int64_t worst = (actual.to(at::kInt) - expected.to(at::kInt)).abs().max().item<int64_t>();
  std::cout << "  [uint8] worst pixel difference " << worst << "\n";
  if (worst <= 1) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "a pixel differs by " << worst << " levels";
}

class Txt2ImgGolden : public ::testing::TestWithParam<std::pair<std::string, std::optional<std::string>>> {};

TEST_P(Txt2ImgGolden, MatchesDiffusersStepByStep) {
  const auto& [name, scheduler_name] = GetParam();
  const io::TensorMap g = io::load_safetensors(sd::test::golden("tiny-sd1/txt2img_" + name + ".safetensors"));
  GoldenRun run = run_golden_setup(tiny_sd1(), scheduler_name, g.at("input.latents"));

  EXPECT_TRUE(at::equal(run.scheduler_timesteps, g.at("scheduler_timesteps")));
  EXPECT_TRUE(
      matches_golden("encoder_hidden_states", run.result.encoder_hidden_states, g.at("encoder_hidden_states"), kTol));
  const auto num_steps = static_cast<size_t>(g.at("scheduler_timesteps").size(0));
  ASSERT_EQ(run.steps.size(), num_steps);
  for (size_t k = 0; k < num_steps; ++k) {
    const std::string p = "step" + std::to_string(k) + ".";
    const DenoisingStep& s = run.steps[k];
    EXPECT_TRUE(at::equal(s.timestep.reshape({1}), g.at(p + "timestep"))) << p << "timestep";
    EXPECT_TRUE(matches_golden(p + "unet_input", s.unet_input, g.at(p + "unet_input"), kTol));
    EXPECT_TRUE(matches_golden(p + "unet_output", s.unet_output, g.at(p + "unet_output"), kTol));
    EXPECT_TRUE(matches_golden(p + "latents_after", s.latents_after, g.at(p + "latents_after"), kTol));
  }
  EXPECT_EQ(run.result.images.scalar_type(), at::kFloat);
  EXPECT_TRUE(matches_golden("image", run.result.images, g.at("image"), kTol));
  EXPECT_EQ(run.result.images_uint8.scalar_type(), at::kByte);
  EXPECT_TRUE(within_one_level(run.result.images_uint8, g.at("image_uint8")));
}

INSTANTIATE_TEST_SUITE_P(TinySd1, Txt2ImgGolden,
                         ::testing::Values(std::pair<std::string, std::optional<std::string>>{"pndm", std::nullopt},
                                           std::pair<std::string, std::optional<std::string>>{"ddim", "DDIMScheduler"},
                                           std::pair<std::string, std::optional<std::string>>{
                                               "euler", "EulerDiscreteScheduler"}),
                         [](const auto& info) { return info.param.first; });

// bf16 (UNet and VAE weights in bfloat16, latents and scheduler in float32) is not a parity claim: this checks the
// path runs end to end, keeps float32 where promised, and lands near the float32 result (bf16 keeps ~3 digits).
TEST(Txt2Img, Bf16RunsTheUNetAndVaeInBf16AndStaysNearFloat32) {
  ComponentDtypes dtypes;
  dtypes.unet = dtypes.vae = at::kBFloat16;
  StableDiffusion pipe = load_pipeline(sd::test::fixtures() / "tiny-sd1", dtypes);
  const io::TensorMap g = io::load_safetensors(sd::test::golden("tiny-sd1/txt2img_pndm.safetensors"));
  GoldenRun run = run_golden_setup(pipe, std::nullopt, g.at("input.latents"));
  for (const auto& s : run.steps) {
    EXPECT_EQ(s.unet_input.scalar_type(), at::kFloat);
    EXPECT_EQ(s.latents_after.scalar_type(), at::kFloat);
  }
  EXPECT_EQ(run.result.images.scalar_type(), at::kFloat);
  const double image_err = (run.result.images - g.at("image")).abs().max().item<double>();
  const double latent_ratio = sd::test::error_ratio(run.steps.back().latents_after, g.at("step4.latents_after"));
  std::cout << "  [bf16] image max|err| " << image_err << ", final latents ratio " << latent_ratio << "\n";
  EXPECT_LT(latent_ratio, sd::test::bf16_tolerance(5e-2));
  EXPECT_LT(image_err, sd::test::bf16_tolerance(5e-2));
  EXPECT_GT(latent_ratio, 0.0);  // it really ran in bf16
}

// Image k of a run with seed S is the single image of a run with seed S + k: each image has its own generator
// (also for the scheduler's noise, checked with the ancestral Euler scheduler, which draws every step).
TEST(Txt2Img, EachImageIsReproducibleAloneFromSeedPlusIndex) {
  StableDiffusion& pipe = tiny_sd1();
  Txt2ImgOptions o;
  o.prompts = {"a red cube", "a blue ball"};
  o.num_images_per_prompt = 2;
  o.num_inference_steps = 3;
  o.seed = 1000;
  auto scheduler = schedulers::make_scheduler(pipe.scheduler_config, "euler_a");
  GenerationResult all = txt2img(pipe, *scheduler, o);
  ASSERT_EQ(all.images.size(0), 4);
  EXPECT_EQ(all.seeds, (std::vector<uint64_t>{1000, 1001, 1002, 1003}));
  for (int64_t k : {1, 2}) {
    Txt2ImgOptions one = o;
    one.prompts = {o.prompts[static_cast<size_t>(k / 2)]};
    one.num_images_per_prompt = 1;
    one.seed = o.seed + static_cast<uint64_t>(k);
    GenerationResult alone = txt2img(pipe, *scheduler, one);
    EXPECT_TRUE(matches_golden("image " + std::to_string(k), alone.images[0], all.images[k], kTol));
  }
  // Different seeds give different images.
  EXPECT_GT((all.images[0] - all.images[1]).abs().max().item<double>(), 1e-2);
}

// The initial latents are randn([1, 4, h, w], generator seeded S + k) per image, as diffusers' randn_tensor with
// a list of generators draws them.
TEST(Txt2Img, RandomLatentsComeFromPerImageGenerators) {
  StableDiffusion& pipe = tiny_sd1();
  Txt2ImgOptions o;
  o.prompts = {kPrompt};
  o.num_images_per_prompt = 2;
  o.num_inference_steps = 1;
  o.seed = 77;
  auto scheduler = schedulers::make_scheduler(pipe.scheduler_config, "ddim");
  std::vector<DenoisingStep> steps;
  GenerationHooks hooks;
  hooks.on_step = [&](const DenoisingStep& s) { steps.push_back(s); };
  txt2img(pipe, *scheduler, o, hooks);
  ASSERT_EQ(steps.size(), 1u);
  for (int64_t k = 0; k < 2; ++k) {
    auto g = at::detail::createCPUGenerator(77 + static_cast<uint64_t>(k));
    at::Tensor expected = at::randn({1, 4, 16, 16}, g);  // DDIM: init_noise_sigma 1, scale_model_input identity
    EXPECT_TRUE(at::equal(steps[0].unet_input[2 + k], expected[0])) << "image " << k;  // cond half
    EXPECT_TRUE(at::equal(steps[0].unet_input[k], expected[0])) << "image " << k;      // uncond half
  }
}

TEST(Txt2Img, GuidanceScaleOneSkipsTheUnconditionalBatch) {
  StableDiffusion& pipe = tiny_sd1();
  const io::TensorMap g = io::load_safetensors(sd::test::golden("tiny-sd1/txt2img_ddim.safetensors"));
  Txt2ImgOptions o;
  o.prompts = {kPrompt};
  o.num_inference_steps = 4;
  o.guidance_scale = 1.0;
  o.initial_latents = g.at("input.latents");
  auto scheduler = schedulers::make_scheduler(pipe.scheduler_config, "ddim");
  std::vector<DenoisingStep> steps;
  GenerationHooks hooks;
  hooks.on_step = [&](const DenoisingStep& s) { steps.push_back(s); };
  GenerationResult r = txt2img(pipe, *scheduler, o, hooks);
  EXPECT_EQ(r.encoder_hidden_states.size(0), 1);
  // The conditional rows are the golden's second half (the golden put the negative prompt first).
  EXPECT_TRUE(matches_golden("cond rows", r.encoder_hidden_states[0], g.at("encoder_hidden_states")[1], kTol));
  ASSERT_EQ(steps.size(), 4u);
  EXPECT_EQ(steps[0].unet_input.size(0), 1);
  // Step 0 sees the same latents with or without guidance, so its UNet output is the golden's conditional half.
  EXPECT_TRUE(matches_golden("step0 cond output", steps[0].unet_output[0], g.at("step0.unet_output")[1], kTol));
}

// diffusers' prompt_embeds= and negative_prompt_embeds=: given rows are what the UNet sees (each half on its own),
// and the prompts' own rows give the images encoding them gives.
TEST(Txt2Img, GivenPromptEmbeddingsReplaceEncoding) {
  StableDiffusion& pipe = tiny_sd1();
  Txt2ImgOptions o;
  o.prompts = {kPrompt};
  o.num_inference_steps = 2;
  auto scheduler = schedulers::make_scheduler(pipe.scheduler_config, "ddim");
  const GenerationResult encoded = txt2img(pipe, *scheduler, o);
  Txt2ImgOptions given = o;
  given.prompt_embeds = encode_text(pipe, {kPrompt});
  given.negative_prompt_embeds = encode_text(pipe, {""});
  const GenerationResult same = txt2img(pipe, *scheduler, given);
  EXPECT_TRUE(at::equal(same.encoder_hidden_states, encoded.encoder_hidden_states));
  EXPECT_TRUE(at::equal(same.images_uint8, encoded.images_uint8));
  given.prompt_embeds = at::zeros_like(given.prompt_embeds);
  const at::Tensor rows = txt2img(pipe, *scheduler, given).encoder_hidden_states;
  EXPECT_TRUE(at::equal(rows[0], encoded.encoder_hidden_states[0]));  // the negative half, still given
  EXPECT_EQ(rows[1].abs().max().item<float>(), 0.0f);
  given = o;
  given.negative_prompt_embeds = at::zeros_like(encoded.encoder_hidden_states.slice(0, 0, 1));
  EXPECT_EQ(txt2img(pipe, *scheduler, given).encoder_hidden_states[0].abs().max().item<float>(), 0.0f);
}

// rescale_noise_cfg (arXiv 2305.08891 eq. 15-16) in float64: phi * cfg * std(text) / std(cfg) + (1 - phi) * cfg,
// with per-image unbiased standard deviations.
TEST(Txt2Img, RescaleNoiseCfgIsThePapersFormula) {
  const at::Tensor cfg = at::randn({2, 4, 8, 8}) * 3, text = at::randn({2, 4, 8, 8});
  const at::Tensor got = rescale_noise_cfg(cfg, text, 0.7);
  for (int64_t k = 0; k < 2; ++k) {
    const at::Tensor c = cfg[k].to(at::kDouble), t = text[k].to(at::kDouble);
    auto stddev = [](const at::Tensor& x) {
      return std::sqrt((x - x.mean()).pow(2).sum().item<double>() / static_cast<double>(x.numel() - 1));
    };
    const at::Tensor expected = 0.7 * c * (stddev(t) / stddev(c)) + 0.3 * c;
    EXPECT_TRUE(matches_golden("rescaled image " + std::to_string(k), got[k], expected, 1e-5));
  }
  EXPECT_TRUE(at::equal(rescale_noise_cfg(cfg, text, 0.0), cfg));
}

// Each step's latents are the scheduler step on the guided, rescaled UNet output the step saw.
TEST(Txt2Img, GuidanceRescaleFeedsTheSchedulerTheRescaledPrediction) {
  StableDiffusion& pipe = tiny_sd1();
  const io::TensorMap g = io::load_safetensors(sd::test::golden("tiny-sd1/txt2img_ddim.safetensors"));
  Txt2ImgOptions o;
  o.prompts = {kPrompt};
  o.num_inference_steps = 3;
  o.guidance_rescale = 0.7;
  o.initial_latents = g.at("input.latents");
  auto scheduler = schedulers::make_scheduler(pipe.scheduler_config, "ddim");
  std::vector<DenoisingStep> steps;
  GenerationHooks hooks;
  hooks.on_step = [&](const DenoisingStep& s) { steps.push_back(s); };
  txt2img(pipe, *scheduler, o, hooks);
  auto replay = schedulers::make_scheduler(pipe.scheduler_config, "ddim");
  replay->set_timesteps(3);
  at::Tensor latents = o.initial_latents;
  ASSERT_EQ(steps.size(), 3u);
  for (const DenoisingStep& s : steps) {
    const auto halves = s.unet_output.chunk(2);
    const at::Tensor guided = halves[0] + 7.5 * (halves[1] - halves[0]);
    latents = replay->step(rescale_noise_cfg(guided, halves[1], 0.7), s.timestep, latents);
    EXPECT_TRUE(matches_golden("latents after step " + std::to_string(s.index), s.latents_after, latents, 1e-6));
  }
}

// With eta > 0 DDIM draws its variance noise per image from that image's generator, after the initial latents
// (diffusers passes the list of generators to step()).
TEST(Txt2Img, DdimEtaDrawsEachImagesNoiseFromItsGenerator) {
  StableDiffusion& pipe = tiny_sd1();
  Txt2ImgOptions o;
  o.prompts = {kPrompt};
  o.num_images_per_prompt = 2;
  o.num_inference_steps = 3;
  o.seed = 11;
  o.eta = 0.5;
  auto scheduler = schedulers::make_scheduler(pipe.scheduler_config, "ddim");
  std::vector<DenoisingStep> steps;
  GenerationHooks hooks;
  hooks.on_step = [&](const DenoisingStep& s) { steps.push_back(s); };
  txt2img(pipe, *scheduler, o, hooks);

  std::vector<at::Generator> generators = image_generators(11, 2);
  at::Tensor latents = randn_per_image(generators, {4, 16, 16});
  auto replay = schedulers::make_scheduler(pipe.scheduler_config, "ddim");
  replay->set_timesteps(3);
  dynamic_cast<schedulers::DDIMScheduler&>(*replay).set_eta(0.5);
  for (const DenoisingStep& s : steps) {
    const auto halves = s.unet_output.chunk(2);
    const at::Tensor guided = halves[0] + 7.5 * (halves[1] - halves[0]);
    latents = replay->step(guided, s.timestep, latents, randn_per_image(generators, {4, 16, 16}));
    EXPECT_TRUE(matches_golden("latents after step " + std::to_string(s.index), s.latents_after, latents, 1e-6));
  }
  // eta 0 is deterministic DDIM: the same run differs.
  Txt2ImgOptions no_eta = o;
  no_eta.eta = 0;
  std::vector<DenoisingStep> plain;
  hooks.on_step = [&](const DenoisingStep& s) { plain.push_back(s); };
  txt2img(pipe, *scheduler, no_eta, hooks);
  EXPECT_GT((plain.back().latents_after - steps.back().latents_after).abs().max().item<double>(), 1e-3);
}

TEST(Txt2Img, RejectsBadInput) {
  StableDiffusion& pipe = tiny_sd1();
  auto scheduler = schedulers::make_scheduler(pipe.scheduler_config);
  Txt2ImgOptions o;
  o.prompts = {kPrompt};
  o.num_inference_steps = 2;
  auto message = [&](const Txt2ImgOptions& opts) { return error_message([&] { txt2img(pipe, *scheduler, opts); }); };

  Txt2ImgOptions bad = o;
  bad.height = 62;
  EXPECT_NE(message(bad).find("height 62 is not a multiple of 4"), std::string::npos) << message(bad);
  bad = o;
  bad.width = 18;
  EXPECT_NE(message(bad).find("width 18 is not a multiple of 4"), std::string::npos) << message(bad);
  bad = o;
  bad.num_inference_steps = 0;
  EXPECT_NE(message(bad).find("num_inference_steps must be >= 1"), std::string::npos) << message(bad);
  bad = o;
  bad.initial_latents = at::zeros({1, 4, 8, 8});
  EXPECT_NE(message(bad).find("initial latents have shape [1, 4, 8, 8]"), std::string::npos) << message(bad);
  bad = o;
  bad.prompts.clear();
  EXPECT_NE(message(bad).find("no prompt"), std::string::npos);
  bad = o;
  bad.negative_prompts = {"a", "b"};
  EXPECT_NE(message(bad).find("negative_prompt given 2 times for 1 prompts"), std::string::npos) << message(bad);
  bad = o;
  bad.eta = 0.5;  // the pipeline's PNDM has no eta
  EXPECT_NE(message(bad).find("eta 0.5 needs the DDIM scheduler"), std::string::npos) << message(bad);
  bad = o;
  bad.guidance_rescale = 1.5;
  EXPECT_NE(message(bad).find("guidance_rescale must be in [0, 1]"), std::string::npos) << message(bad);
  bad = o;
  bad.prompt_embeds = at::zeros({2, 77, 32});
  EXPECT_NE(message(bad).find("prompt_embeds: expected [1, L, D] (one row block per prompt), got [2, 77, 32]"),
            std::string::npos)
      << message(bad);
  bad = o;
  bad.prompt_embeds = at::zeros({1, 77, 32});
  bad.negative_prompt_embeds = at::zeros({1, 76, 32});
  EXPECT_NE(message(bad).find("negative_prompt_embeds [1, 76, 32] must have the shape of prompt_embeds [1, 77, 32]"),
            std::string::npos)
      << message(bad);
  bad = o;
  bad.clip_skip = -1;
  EXPECT_NE(message(bad).find("clip_skip must be >= 0"), std::string::npos) << message(bad);
  EXPECT_NE(error_message([&] {
              schedulers::make_scheduler(pipe.scheduler_config, "bogus");
            }).find("unknown scheduler \"bogus\""),
            std::string::npos);
}

TEST(Txt2Img, DefaultSizeIsSampleSizeTimesVaeFactor) {
  EXPECT_EQ(resolve_image_size(tiny_sd1(), {}), (std::pair<int64_t, int64_t>{64, 64}));
  Txt2ImgOptions o;
  o.height = 32;
  o.width = 48;
  EXPECT_EQ(resolve_image_size(tiny_sd1(), o), (std::pair<int64_t, int64_t>{32, 48}));
}

}  // namespace
}  // namespace sd::pipeline
