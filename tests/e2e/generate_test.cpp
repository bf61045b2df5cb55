// `sdtrain generate` end to end: the tiny-sd1 txt2img goldens through the binary (--init_latents, --save_raw and
// the PNGs), embeddings, negative prompts per prompt, the sampler options, img2img, file names and sizes, pipe
// output, and one clear line for every bad input.
#include <ATen/ATen.h>

#include <fstream>
#include <limits>
#include <sstream>

#include "io/image.h"
#include "io/safetensors.h"
#include "models/model_test_util.h"
#include "pipeline/embedding_file.h"
#include "pipeline/img2img.h"
#include "pipeline/stable_diffusion.h"
#include "pipeline/textual_inversion_embeddings.h"
#include "pipeline/txt2img.h"
#include "schedulers/factory.h"
#include "test_util.h"

namespace sd {
namespace {

namespace fs = std::filesystem;
using sd::test::matches_golden;

const char* kPrompt = "a photo of an astronaut riding a horse";

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

sd::test::CommandResult generate(const std::string& args) {
  return sd::test::run_command(sd::test::sdtrain_binary() + " generate " + args);
}

std::string tiny() { return quote((sd::test::fixtures() / "tiny-sd1").string()); }

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

at::Tensor pixels_of(const io::RgbImage& image) {
  return at::from_blob(const_cast<uint8_t*>(image.pixels.data()), {image.height, image.width, 3}, at::kByte).clone();
}

class GenerateGolden : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(GenerateGolden, BinaryReproducesDiffusers) {
  const auto& [name, scheduler] = GetParam();
  const io::TensorMap g = io::load_safetensors(sd::test::golden("tiny-sd1/txt2img_" + name + ".safetensors"));
  sd::test::TempDir dir;
  io::save_safetensors(dir.path() / "latents.safetensors", {{"latents", g.at("input.latents")}});
  const fs::path raw = dir.path() / "raw.safetensors";
  const fs::path out = dir.path() / "out";
  std::string args = "--model " + tiny() + " --prompt " + quote(kPrompt) +
                     " --num_inference_steps 4 --guidance_scale 7.5 --seed 42 --threads 1 --init_latents " +
                     quote((dir.path() / "latents.safetensors").string()) + " --save_raw " + quote(raw.string()) +
                     " --output_dir " + quote(out.string());
  if (!scheduler.empty()) args += " --scheduler " + scheduler;
  auto r = generate(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines_of(r.output),
            (std::vector<std::string>{(out / "p0-s42-i0.png").string(), (out / "grid.png").string(), raw.string()}));
  io::SafeTensorsFile file(raw);
  EXPECT_EQ(file.names(), std::vector<std::string>{"images"});
  const at::Tensor images = file.read("images");
  EXPECT_EQ(images.scalar_type(), at::kFloat);
  EXPECT_TRUE(matches_golden("image via binary", images, g.at("image"), 1e-4));
  const at::Tensor png = pixels_of(io::load_image_rgb(out / "p0-s42-i0.png"));
  const int64_t worst = (png.to(at::kInt) - g.at("image_uint8")[0].to(at::kInt)).abs().max().item<int64_t>();
  EXPECT_LE(worst, 1) << "PNG pixels vs golden image_uint8";
}

INSTANTIATE_TEST_SUITE_P(TinySd1, GenerateGolden,
                         ::testing::Values(std::pair<std::string, std::string>{"pndm", ""},
                                           std::pair<std::string, std::string>{"ddim", "ddim"},
                                           std::pair<std::string, std::string>{"euler", "EulerDiscreteScheduler"}),
                         [](const auto& info) { return info.param.first; });

// File names (prompt index, the image's own seed, image index), sizes, the grid, and nothing but paths on a pipe.
TEST(Generate, WritesNamedPngsAndOnlyPathsOnAPipe) {
  sd::test::TempDir dir;
  const fs::path prompts = dir.path() / "prompts.txt";
  std::ofstream(prompts) << "a red cube\r\n\n  \na blue ball\n";
  const fs::path out = dir.path() / "out";
  auto r = generate("--model " + tiny() + " --prompt_file " + quote(prompts.string()) +
                    " --num_images_per_prompt 2 --num_inference_steps 2 --height 32 --width 48 --seed 5 " +
                    "--threads 1 --output_dir " + quote(out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> expected;
  for (const char* name : {"p0-s5-i0.png", "p0-s6-i1.png", "p1-s7-i0.png", "p1-s8-i1.png", "grid.png"})
    expected.push_back((out / name).string());
  EXPECT_EQ(lines_of(r.output), expected);
  std::vector<at::Tensor> cells;
  for (size_t k = 0; k < 4; ++k) {
    io::RgbImage image = io::load_image_rgb(expected[k]);
    EXPECT_EQ(image.width, 48);
    EXPECT_EQ(image.height, 32);
    cells.push_back(pixels_of(image));
  }
  io::RgbImage grid = io::load_image_rgb(out / "grid.png");
  EXPECT_EQ(grid.width, 96);   // two images per prompt side by side
  EXPECT_EQ(grid.height, 64);  // one row per prompt
  const at::Tensor g = pixels_of(grid);
  EXPECT_TRUE(at::equal(g.narrow(0, 0, 32).narrow(1, 48, 48), cells[1]));
  EXPECT_TRUE(at::equal(g.narrow(0, 32, 32).narrow(1, 0, 48), cells[2]));
}

TEST(Generate, RandomSeedIsPrintedAndNamesTheFiles) {
  sd::test::TempDir dir;
  auto r = generate("--model " + tiny() + " --prompt cat --num_inference_steps 1 --threads 1 --output_dir " +
                    quote(dir.path().string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lines = lines_of(r.output);
  ASSERT_EQ(lines.size(), 3u) << r.output;
  ASSERT_EQ(lines[0].rfind("seed ", 0), 0u) << lines[0];
  const std::string seed = lines[0].substr(5);
  EXPECT_EQ(lines[1], (dir.path() / ("p0-s" + seed + "-i0.png")).string());
}

// --embeddings through the binary gives what the library gives with the embedding applied (and the embedding
// changes the image of a prompt that uses its token).
TEST(Generate, EmbeddingsAreUsedByPrompts) {
  sd::test::TempDir dir;
  const auto emb = sd::test::golden("tiny-sd1/learned_embeds.safetensors");
  const fs::path raw = dir.path() / "raw.safetensors";
  auto r =
      generate("--model " + tiny() + " --prompt " + quote("a <dicoo> toy") + " --embeddings " + quote(emb.string()) +
               " --num_inference_steps 2 --seed 3 --threads 1 --output_dir '' --save_raw " + quote(raw.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const at::Tensor from_binary = io::load_safetensors(raw).at("images");

  pipeline::StableDiffusion pipe = pipeline::load_pipeline(sd::test::fixtures() / "tiny-sd1");
  pipeline::Txt2ImgOptions o;
  o.prompts = {"a <dicoo> toy"};
  o.num_inference_steps = 2;
  o.seed = 3;
  auto scheduler = schedulers::make_scheduler(pipe.scheduler_config);
  const at::Tensor without = pipeline::txt2img(pipe, *scheduler, o).images;
  pipeline::load_textual_inversion(pipe.tokenizer, pipe.text_encoder, pipeline::load_embedding_file(emb), emb.string());
  const at::Tensor with = pipeline::txt2img(pipe, *scheduler, o).images;
  EXPECT_TRUE(matches_golden("binary vs library with embedding", from_binary, with, 1e-5));
  EXPECT_GT((with - without).abs().max().item<double>(), 1e-3);
}

// The images a generate run saved with --save_raw.
at::Tensor raw_images(const fs::path& raw) { return io::load_safetensors(raw).at("images"); }

pipeline::StableDiffusion& library_pipeline() {
  static pipeline::StableDiffusion pipe = pipeline::load_pipeline(sd::test::fixtures() / "tiny-sd1");
  return pipe;
}

// One negative prompt per prompt, in order, through the binary: the library's result with the same options.
TEST(Generate, NegativePromptPerPromptMatchesTheLibrary) {
  sd::test::TempDir dir;
  const fs::path raw = dir.path() / "raw.safetensors";
  auto r = generate("--model " + tiny() + " --prompt 'a red cube' --prompt 'a blue ball' --negative_prompt blurry " +
                    "--negative_prompt dark --num_inference_steps 2 --seed 3 --threads 1 --output_dir '' " +
                    "--save_raw " + quote(raw.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  pipeline::Txt2ImgOptions o;
  o.prompts = {"a red cube", "a blue ball"};
  o.negative_prompts = {"blurry", "dark"};
  o.num_inference_steps = 2;
  o.seed = 3;
  auto scheduler = schedulers::make_scheduler(library_pipeline().scheduler_config);
  const at::Tensor expected = pipeline::txt2img(library_pipeline(), *scheduler, o).images;
  EXPECT_TRUE(matches_golden("binary vs library, negative prompts", raw_images(raw), expected, 1e-5));
  // Swapping the negatives changes the images: each prompt got its own.
  o.negative_prompts = {"dark", "blurry"};
  const at::Tensor swapped = pipeline::txt2img(library_pipeline(), *scheduler, o).images;
  EXPECT_GT((swapped - expected).abs().max().item<double>(), 1e-3);
}

// The sampler flags reach the library: eta with DDIM, guidance_rescale, clip_skip, a Karras alias.
TEST(Generate, SamplerFlagsMatchTheLibrary) {
  sd::test::TempDir dir;
  const fs::path raw = dir.path() / "raw.safetensors";
  auto r = generate("--model " + tiny() + " --prompt cat --scheduler ddim --eta 0.5 --guidance_rescale 0.7 " +
                    "--clip_skip 1 --num_inference_steps 2 --seed 4 --threads 1 --output_dir '' --save_raw " +
                    quote(raw.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  pipeline::Txt2ImgOptions o;
  o.prompts = {"cat"};
  o.num_inference_steps = 2;
  o.seed = 4;
  o.eta = 0.5;
  o.guidance_rescale = 0.7;
  o.clip_skip = 1;
  auto ddim = schedulers::make_scheduler(library_pipeline().scheduler_config, "ddim");
  EXPECT_TRUE(matches_golden("binary vs library, ddim options", raw_images(raw),
                             pipeline::txt2img(library_pipeline(), *ddim, o).images, 1e-5));

  r = generate("--model " + tiny() + " --prompt cat --scheduler dpm++ --use_karras_sigmas --num_inference_steps 3 " +
               "--seed 4 --threads 1 --output_dir '' --save_raw " + quote(raw.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  pipeline::Txt2ImgOptions k;
  k.prompts = {"cat"};
  k.num_inference_steps = 3;
  k.seed = 4;
  auto karras = schedulers::make_scheduler(library_pipeline().scheduler_config, "dpm++_karras");
  EXPECT_TRUE(matches_golden("binary vs library, dpm++ karras", raw_images(raw),
                             pipeline::txt2img(library_pipeline(), *karras, k).images, 1e-5));
}

// --init_image runs img2img: the library's result, the image's size rounded down to the VAE factor (4 here).
TEST(Generate, InitImageRunsImg2Img) {
  sd::test::TempDir dir;
  const fs::path image = sd::test::golden("images/portrait_90x140.png");
  const fs::path out = dir.path() / "out";
  const fs::path raw = dir.path() / "raw.safetensors";
  auto r = generate("--model " + tiny() + " --prompt cat --init_image " + quote(image.string()) +
                    " --strength 0.6 --scheduler euler_a --num_inference_steps 5 --seed 8 --threads 1 --output_dir " +
                    quote(out.string()) + " --save_raw " + quote(raw.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const io::RgbImage png = io::load_image_rgb(out / "p0-s8-i0.png");
  EXPECT_EQ(png.width, 88);
  EXPECT_EQ(png.height, 140);

  pipeline::Img2ImgOptions o;
  o.prompts = {"cat"};
  o.init_image = io::load_image_rgb(image);
  o.strength = 0.6;
  o.num_inference_steps = 5;
  o.seed = 8;
  auto scheduler = schedulers::make_scheduler(library_pipeline().scheduler_config, "euler_a");
  EXPECT_TRUE(matches_golden("binary vs library, img2img", raw_images(raw),
                             pipeline::img2img(library_pipeline(), *scheduler, o).images, 1e-5));
}

// Every bad input: a non-zero exit and exactly one line saying what is wrong.
void expect_one_line_error(const std::string& args, const std::string& needle) {
  EXPECT_TRUE(sd::test::is_one_line_error(generate(args), needle)) << args;
}

// A model whose weights went NaN (a diverged training run) must not give black PNGs and exit 0.
// A copy of tiny-sd1 whose UNet conv_out.bias is filled with `value`.
fs::path model_with_conv_out_bias(const fs::path& dir, float value) {
  const fs::path model = dir / "model";
  fs::copy(sd::test::fixtures() / "tiny-sd1", model, fs::copy_options::recursive);
  const fs::path unet = model / "unet" / "diffusion_pytorch_model.safetensors";
  io::TensorMap weights = io::load_safetensors(unet);
  weights.at("conv_out.bias").fill_(value);
  io::save_safetensors(unet, weights);
  return model;
}

TEST(Generate, NonFiniteImagesAreAnErrorAndNothingIsWritten) {
  sd::test::TempDir dir;
  // Finite weights so large that the sampling overflows: a diverged model that loads.
  const fs::path model = model_with_conv_out_bias(dir.path(), 3e38f);
  const fs::path out = dir.path() / "out";
  EXPECT_TRUE(sd::test::is_one_line_error(
      generate("--model " + quote(model.string()) + " --prompt x --num_inference_steps 2 --height 64 --width 64 " +
               "--seed 1 --output_dir " + quote(out.string())),
      "the generated images contain NaN or infinite values"));
  EXPECT_FALSE(fs::exists(out / "grid.png"));
}

TEST(Generate, NonFiniteWeightsAreRefusedAtLoadNamingTheTensor) {
  sd::test::TempDir dir;
  const fs::path model = model_with_conv_out_bias(dir.path(), std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(sd::test::is_one_line_error(
      generate("--model " + quote(model.string()) + " --prompt x --num_inference_steps 2 --height 64 --width 64 " +
               "--seed 1 --output_dir " + quote((dir.path() / "out").string())),
      "unet/diffusion_pytorch_model.safetensors: tensor 'conv_out.bias' holds 4 NaN or infinite values (of 4)"));
}

TEST(Generate, BadInputGetsOneClearLine) {
  sd::test::TempDir dir;
  const std::string model = "--model " + tiny() + " --prompt cat --seed 1 --threads 1 --output_dir " +
                            quote((dir.path() / "out").string()) + " ";
  const std::string base = model + "--num_inference_steps 1 ";
  expect_one_line_error(base + "--scheduler bogus", "unknown scheduler \"bogus\"");
  expect_one_line_error(model + "--num_inference_steps 0", "--num_inference_steps: 0 is outside 1..10000");
  expect_one_line_error(base + "--height 66", "--height 66 is not a positive multiple of 4, the VAE's scale factor");
  expect_one_line_error(base + "--width 30", "--width 30 is not a positive multiple of 4");

  io::save_safetensors(dir.path() / "wide.safetensors", {{"<wide>", at::zeros({1, 64})}});
  expect_one_line_error(base + "--embeddings " + quote((dir.path() / "wide.safetensors").string()),
                        "wide.safetensors: embedding '<wide>' has width 64 but the text encoder's hidden_size is 32");
  io::save_safetensors(dir.path() / "known.safetensors", {{"<|endoftext|>", at::zeros({1, 32})}});
  expect_one_line_error(base + "--embeddings " + quote((dir.path() / "known.safetensors").string()),
                        "known.safetensors: token '<|endoftext|>' is already in the tokenizer's vocabulary");
  const std::string emb = quote(sd::test::golden("tiny-sd1/learned_embeds.safetensors").string());
  expect_one_line_error(base + "--embeddings " + emb + " --embeddings " + emb,
                        "token '<dicoo>' is already in the tokenizer's vocabulary");

  io::save_safetensors(dir.path() / "latents.safetensors", {{"latents", at::zeros({2, 4, 16, 16})}});
  expect_one_line_error(base + "--init_latents " + quote((dir.path() / "latents.safetensors").string()),
                        "initial latents have shape [2, 4, 16, 16] but 1 image(s) of 64x64 need [1, 4, 16, 16]");
  io::save_safetensors(dir.path() / "nan.safetensors", {{"latents", at::full({1, 4, 16, 16}, NAN)}});
  expect_one_line_error(base + "--init_latents " + quote((dir.path() / "nan.safetensors").string()),
                        "--init_latents " + (dir.path() / "nan.safetensors").string() +
                            ": tensor 'latents' holds NaN or infinite values");

  expect_one_line_error(base + "--negative_prompt a --negative_prompt b",
                        "negative_prompt given 2 times for 1 prompts: give one for every prompt or one per prompt");
  expect_one_line_error(base + "--eta 0.5", "eta 0.5 needs the DDIM scheduler (scheduler ddim); PNDMScheduler");
  expect_one_line_error(base + "--eta 1.5 --scheduler ddim", "eta must be in [0, 1], got 1.5");
  expect_one_line_error(base + "--guidance_rescale 2", "guidance_rescale must be in [0, 1], got 2");
  expect_one_line_error(base + "--clip_skip -1", "clip_skip must be >= 0, got -1");
  expect_one_line_error(base + "--clip_skip 9", "clip_skip 9 is out of range: the text encoder has 5 layers");
  expect_one_line_error(base + "--use_karras_sigmas", "--use_karras_sigmas: PNDMScheduler has no Karras sigmas");
  expect_one_line_error(base + "--use_karras_sigmas --scheduler ddim",
                        "--use_karras_sigmas: DDIMScheduler has no Karras sigmas");
  expect_one_line_error(base + "--strength 0.5", "--strength needs --init_image");
  const std::string image = " --init_image " + quote(sd::test::golden("images/portrait_90x140.png").string());
  expect_one_line_error(base + "--init_image " + quote((dir.path() / "missing.png").string()),
                        "--init_image: " + (dir.path() / "missing.png").string());
  expect_one_line_error(base + image + " --strength 0", "strength must be in (0, 1], got 0");
  expect_one_line_error(base + image + " --strength 1.5", "strength must be in (0, 1], got 1.5");
  expect_one_line_error(model + "--num_inference_steps 2" + image + " --strength 0.4",
                        "strength 0.4 of 2 inference steps runs no step");
  expect_one_line_error(base + image + " --height 64", "--height/--width cannot be combined with --init_image");
  expect_one_line_error(base + image + " --guidance_rescale 0.5",
                        "--guidance_rescale cannot be combined with --init_image");

  const std::string rest = " --prompt cat --num_inference_steps 1 --threads 1";
  expect_one_line_error("--model " + quote((dir.path() / "nowhere").string()) + rest,
                        ": not found (expected a diffusers pipeline folder, a single-file checkpoint or a Hub name");
  // A pipeline copy with a truncated UNet file, then one without its vae/ folder.
  const fs::path broken = dir.path() / "broken";
  fs::copy(sd::test::fixtures() / "tiny-sd1", broken, fs::copy_options::recursive);
  const fs::path unet = broken / "unet" / "diffusion_pytorch_model.safetensors";
  fs::resize_file(unet, fs::file_size(unet) / 2);
  expect_one_line_error("--model " + quote(broken.string()) + rest, unet.string());
  fs::remove_all(broken / "vae");
  expect_one_line_error("--model " + quote(broken.string()) + rest, "missing the vae/ folder");
}

}  // namespace
}  // namespace sd
