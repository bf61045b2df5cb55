// `sdtrain generate`: text-to-image (StableDiffusionPipeline) or, with --init_image, image-to-image
// (StableDiffusionImg2ImgPipeline) with a diffusers pipeline folder, as diffusers 0.24 computes them. Writes one
// PNG per image plus a grid, optionally the raw float images; on a pipe stdout carries only the paths written (and
// the seed when it was drawn at random).
#include <ATen/Parallel.h>

#include <cstdio>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "core/threads.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_flags.h"
#include "core/error.h"
#include "core/progress.h"
#include "io/atomic_file.h"
#include "io/image.h"
#include "io/safetensors.h"
#include "io/tensor_file.h"
#include "pipeline/embedding_file.h"
#include "pipeline/img2img.h"
#include "pipeline/lora_file.h"
#include "pipeline/model_source.h"
#include "pipeline/textual_inversion_embeddings.h"
#include "pipeline/txt2img.h"
#include "train/precision.h"
#include "schedulers/factory.h"

namespace sd::cli {

namespace {

namespace fs = std::filesystem;

struct GenerateOptions {
  pipeline::ModelRequest model;
  std::vector<std::string> prompts;
  std::string prompt_file;
  std::vector<std::string> negative_prompts;
  int num_inference_steps = 50;
  double guidance_scale = 7.5;
  double guidance_rescale = 0.0;
  double eta = 0.0;
  std::optional<int> clip_skip;
  std::optional<int64_t> height, width;
  std::optional<uint64_t> seed;
  int64_t num_images_per_prompt = 1;
  std::optional<std::string> scheduler;
  bool use_karras_sigmas = false;
  std::string init_image;
  std::optional<double> strength;
  std::string mixed_precision = "no";
  std::vector<std::string> embeddings;
  LoraRequest loras;
  std::string vae;
  bool fuse_lora = false;
  std::string init_latents;
  std::string output_dir = "generated";
  std::string save_raw;
  std::optional<int> threads;
};

constexpr double kDefaultStrength = 0.8;  // diffusers' img2img default

std::vector<std::string> read_prompt_file(const fs::path& path) {
  std::istringstream in(io::read_text_file(path));
  std::vector<std::string> prompts;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) prompts.push_back(line);
  }
  SD_CHECK(!prompts.empty(), "--prompt_file {}: no prompts in the file (one per line)", path.string());
  return prompts;
}

// A tensor named "latents", or the file's only tensor.
at::Tensor read_init_latents(const fs::path& path) {
  io::TensorMap tensors;
  try {
    tensors = io::load_safetensors(path);
  } catch (const Error& e) {
    fail("--init_latents: {}", e.what());
  }
  auto it = tensors.find("latents");
  if (it == tensors.end()) {
    SD_CHECK(tensors.size() == 1, "--init_latents {}: expected a tensor named 'latents' or a single tensor, found {}",
             path.string(), tensors.size());
    it = tensors.begin();
  }
  SD_CHECK(io::count_nonfinite(it->second) == 0, "--init_latents {}: tensor '{}' holds NaN or infinite values",
           path.string(), it->first);
  return it->second;
}

// The decoded init image; a missing or unreadable file names the flag.
io::RgbImage read_init_image(const fs::path& path) {
  try {
    return io::load_image_rgb(path);
  } catch (const Error& e) {
    fail("--init_image: {}", e.what());
  }
}

// The pipeline's scheduler or --scheduler, with --use_karras_sigmas applied.
std::unique_ptr<schedulers::Scheduler> make_run_scheduler(schedulers::SchedulerConfig config,
                                                          const GenerateOptions& o) {
  if (o.use_karras_sigmas) {
    config.use_karras_sigmas = true;
    const std::string cls = o.scheduler ? schedulers::canonical_scheduler_name(*o.scheduler) : config.class_name;
    SD_CHECK(schedulers::has_karras_sigmas(cls),
             "--use_karras_sigmas: {} has no Karras sigmas (DPMSolverMultistep, UniPCMultistep, EulerDiscrete, Heun "
             "and LMS have; choose one with --scheduler)",
             cls);
  }
  return schedulers::make_scheduler(config, o.scheduler);
}

// Flags that belong to one pipeline only.
void check_flag_combinations(const GenerateOptions& o) {
  if (o.init_image.empty()) {
    SD_CHECK(!o.strength, "--strength needs --init_image (it sets how far img2img moves from that image)");
    return;
  }
  SD_CHECK(!o.height && !o.width,
           "--height/--width cannot be combined with --init_image: img2img keeps the image's "
           "size (rounded down to the VAE's scale factor)");
  SD_CHECK(o.init_latents.empty(), "--init_latents cannot be combined with --init_image");
  SD_CHECK(o.guidance_rescale == 0,
           "--guidance_rescale cannot be combined with --init_image (diffusers' "
           "StableDiffusionImg2ImgPipeline has no guidance_rescale)");
}

// Before the run, so that a path that cannot be written leaves no half of the outputs behind.
void check_output_locations(const GenerateOptions& o) {
  SD_CHECK(!o.output_dir.empty() || !o.save_raw.empty(),
           "nothing would be written: --output_dir is empty and --save_raw is not given");
  if (!o.output_dir.empty()) io::check_output_file("--output_dir", fs::path(o.output_dir) / "grid.png");
  if (!o.save_raw.empty()) io::check_output_file("--save_raw", o.save_raw);
}

// The arguments both pipelines take.
void fill_common_options(const GenerateOptions& o, pipeline::GenerationOptions& options) {
  options.prompts = o.prompts;
  options.negative_prompts = o.negative_prompts;
  options.num_inference_steps = o.num_inference_steps;
  options.guidance_scale = o.guidance_scale;
  options.num_images_per_prompt = o.num_images_per_prompt;
  options.eta = o.eta;
  options.clip_skip = o.clip_skip;
}

// rows = prompts, columns = images per prompt.
io::RgbImage make_grid(const at::Tensor& images, int64_t rows, int64_t cols) {  // [rows*cols, H, W, 3] uint8
  const int64_t h = images.size(1), w = images.size(2);
  at::Tensor grid = images.reshape({rows, cols, h, w, 3}).permute({0, 2, 1, 3, 4}).reshape({rows * h, cols * w, 3});
  return pipeline::to_rgb_image(grid);
}

// The PNGs, the grid and the raw images the flags ask for; returns the paths written.
std::vector<fs::path> write_outputs(const GenerateOptions& o, const pipeline::GenerationResult& result) {
  std::vector<fs::path> written;
  if (!o.output_dir.empty()) {
    const fs::path out = o.output_dir;
    fs::create_directories(out);
    const int64_t per_prompt = o.num_images_per_prompt;
    for (int64_t k = 0; k < result.images_uint8.size(0); ++k) {
      const fs::path path = out / fmt::format("p{}-s{}-i{}.png", k / per_prompt, result.seeds[k], k % per_prompt);
      io::save_png(path, pipeline::to_rgb_image(result.images_uint8[k]));
      written.push_back(path);
    }
    const fs::path grid = out / "grid.png";
    io::save_png(grid, make_grid(result.images_uint8, static_cast<int64_t>(o.prompts.size()), per_prompt));
    written.push_back(grid);
  }
  if (!o.save_raw.empty()) {
    io::save_safetensors(o.save_raw, {{"images", result.images}});
    written.push_back(o.save_raw);
  }
  return written;
}

int run_generate(GenerateOptions o) {
  set_compute_threads(o.threads ? *o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const pipeline::ModelSource source = pipeline::resolve_model(o.model);

  // Cheap checks first, so a typo fails before the weights load.
  check_flag_combinations(o);
  check_output_locations(o);
  const pipeline::PipelineConfigs configs = pipeline::read_configs(source);
  std::unique_ptr<schedulers::Scheduler> scheduler = make_run_scheduler(configs.scheduler, o);
  SD_CHECK(o.num_inference_steps >= 1, "--num_inference_steps must be >= 1, got {}", o.num_inference_steps);
  scheduler->set_timesteps(o.num_inference_steps);
  const int64_t f = int64_t{1} << (configs.vae.block_out_channels.size() - 1);
  for (const auto& [name, value] : {std::pair{"--height", o.height}, std::pair{"--width", o.width}}) {
    if (!value) continue;
    SD_CHECK(*value > 0 && *value % f == 0, "{} {} is not a positive multiple of {}, the VAE's scale factor", name,
             *value, f);
  }
  if (!o.prompt_file.empty()) o.prompts = read_prompt_file(o.prompt_file);
  SD_CHECK(!o.prompts.empty(), "no prompt: give --prompt (repeatable) or --prompt_file");

  pipeline::Txt2ImgOptions txt2img_options;
  pipeline::Img2ImgOptions img2img_options;
  const bool image_to_image = !o.init_image.empty();
  if (image_to_image) {
    fill_common_options(o, img2img_options);
    img2img_options.init_image = read_init_image(o.init_image);
    img2img_options.strength = o.strength.value_or(kDefaultStrength);
    pipeline::check_img2img_options(img2img_options, *scheduler);
  } else {
    fill_common_options(o, txt2img_options);
    txt2img_options.guidance_rescale = o.guidance_rescale;
    if (!o.init_latents.empty()) txt2img_options.initial_latents = read_init_latents(o.init_latents);
    pipeline::check_txt2img_options(txt2img_options, *scheduler);
  }
  std::vector<pipeline::EmbeddingFile> embeddings;
  for (const auto& path : o.embeddings) embeddings.push_back(pipeline::load_embedding_file(path));
  check_lora_files_exist(o.loras);
  check_vae_exists(o.vae);

  // The pipeline and what is loaded into it.
  // The UNet and VAE in the frozen-model dtype of the training policy: bf16, or float32 where bf16 is slow.
  pipeline::ComponentDtypes dtypes;
  dtypes.unet = dtypes.vae = train::PrecisionPolicy::from_flag(o.mixed_precision).frozen;
  pipeline::StableDiffusion pipe = pipeline::load_pipeline(source, dtypes);
  if (!o.vae.empty()) pipeline::replace_vae(pipe, o.vae);
  for (size_t i = 0; i < embeddings.size(); ++i)
    pipeline::load_textual_inversion(pipe.tokenizer, pipe.text_encoder, embeddings[i], o.embeddings[i]);
  pipeline::apply_lora_files(pipe, o.loras.files, o.loras.scales, o.fuse_lora);

  // Latents given without a size: the size is theirs.
  if (txt2img_options.initial_latents.defined() && txt2img_options.initial_latents.dim() == 4) {
    if (!o.height) o.height = txt2img_options.initial_latents.size(2) * f;
    if (!o.width) o.width = txt2img_options.initial_latents.size(3) * f;
  }
  txt2img_options.height = o.height.value_or(0);
  txt2img_options.width = o.width.value_or(0);
  const bool random_seed = !o.seed;
  // 31 bits: a seed short enough to retype, like the ones people pass to torch.manual_seed.
  const uint64_t seed = o.seed ? *o.seed : std::random_device{}() & 0x7fffffffu;
  txt2img_options.seed = img2img_options.seed = seed;
  if (random_seed) std::printf("seed %llu\n", static_cast<unsigned long long>(seed));

  // Table entries the run visits: PNDM runs one step more than asked, Heun two per step, img2img only the tail.
  const int64_t total =
      image_to_image ? pipeline::img2img_timesteps(*scheduler, o.num_inference_steps, img2img_options.strength).size(0)
                     : scheduler->timesteps().size(0);
  ProgressBar bar("generate", total);
  pipeline::GenerationHooks hooks;
  hooks.on_progress = [&bar](int done, int total) { bar.update(done); };
  const pipeline::GenerationResult result = image_to_image
                                                ? pipeline::img2img(pipe, *scheduler, img2img_options, hooks)
                                                : pipeline::txt2img(pipe, *scheduler, txt2img_options, hooks);
  bar.finish();
  // NaN pixels would be written as black images with exit 0; a diverged model must be noticed.
  SD_CHECK(at::isfinite(result.images).all().item<bool>(),
           "the generated images contain NaN or infinite values (the model's weights or the guidance diverged); "
           "nothing was written");

  for (const auto& path : write_outputs(o, result)) std::printf("%s\n", path.string().c_str());
  return 0;
}

}  // namespace

void add_generate(CLI::App& app, std::function<int()>& chosen) {
  auto* cmd = app.add_subcommand(
      "generate", "Generate images from text prompts (or from an image and prompts) with a Stable Diffusion model");
  auto o = std::make_shared<GenerateOptions>();
  add_model_flags(cmd, "--model", o->model)->required();
  auto* prompt = repeated_flag(cmd, "--prompt", o->prompts, "A prompt (repeatable: one batch of images per prompt)");
  flag(cmd, "--prompt_file", o->prompt_file, "A text file with one prompt per line (blank lines skipped)")
      ->excludes(prompt);
  repeated_flag(cmd, "--negative_prompt", o->negative_prompts,
                "What the images should not show: once for every prompt, or once per prompt in their order");
  flag(cmd, "--num_inference_steps", o->num_inference_steps, "Denoising steps")->check(in_range(1, 10000));
  flag(cmd, "--guidance_scale", o->guidance_scale, "Classifier-free guidance scale; <= 1 turns guidance off")
      ->check(finite_number());
  flag(cmd, "--guidance_rescale", o->guidance_rescale,
       "Rescale the guided prediction towards the text prediction's std (arXiv 2305.08891 sec. 3.4), 0..1; txt2img");
  flag(cmd, "--eta", o->eta, "DDIM's eta, 0..1: weight of the noise added in each step (needs --scheduler ddim)");
  flag(cmd, "--clip_skip", o->clip_skip,
       "Skip this many text-encoder layers from the end for the prompts (1 = the penultimate layer's output)");
  flag(cmd, "--height", o->height, "Image height in pixels (default: the UNet's sample_size x the VAE factor)")
      ->check(in_range(8, 16384));
  flag(cmd, "--width", o->width, "Image width in pixels (default: the UNet's sample_size x the VAE factor)")
      ->check(in_range(8, 16384));
  flag(cmd, "--seed", o->seed,
       "Seed (random and printed when absent); image k of the run (prompt i, image j: k = i*num_images_per_prompt + j) "
       "uses a generator seeded seed + k, so it reproduces alone with --seed seed+k")
      ->check(seed_value());
  flag(cmd, "--num_images_per_prompt", o->num_images_per_prompt, "Images per prompt")->check(in_range(1, 256));
  flag(cmd, "--scheduler", o->scheduler,
       "Scheduler class or alias (pndm, ddim, ddpm, euler, euler_a, heun, lms, dpm++, unipc, dpm++_karras, "
       "euler_karras, ...); default: the pipeline's");
  switch_flag(cmd, "--use_karras_sigmas", o->use_karras_sigmas,
              "Karras et al. sigmas (DPM-Solver, UniPC, Euler, Heun, LMS): 'DPM++ 2M Karras' is --scheduler dpm++ "
              "--use_karras_sigmas");
  flag(cmd, "--init_image", o->init_image,
       "img2img: start from this image (PNG/JPEG/BMP); the output keeps its size, rounded down to the VAE factor");
  flag(cmd, "--strength", o->strength,
       fmt::format("img2img: share of the schedule to run, in (0, 1]; 1 keeps little of the image (default {})",
                   kDefaultStrength));
  flag(cmd, "--mixed_precision", o->mixed_precision,
       "bf16 runs the UNet and VAE in bfloat16 (in float32, with a note, on CPUs without AVX-512)")
      ->check(CLI::IsMember({"no", "bf16"}));
  repeated_flag(cmd, "--embeddings", o->embeddings,
                "A textual-inversion embedding file (diffusers learned_embeds or A1111 format; repeatable)");
  add_lora_flags(cmd, o->loras, "applied while generating");
  add_vae_flag(cmd, o->vae, "to encode and decode the images");
  switch_flag(cmd, "--fuse_lora", o->fuse_lora,
              "Merge the LoRAs into the weights before generating (diffusers' fuse_lora)");
  flag(cmd, "--init_latents", o->init_latents,
       "Start from these latents (safetensors: tensor 'latents' or the only tensor, [N,4,h,w]) for reproducibility");
  flag(cmd, "--output_dir", o->output_dir,
       "Where PNGs go: p<prompt>-s<seed>-i<image>.png per image and grid.png (rows: prompts); '' writes none");
  flag(cmd, "--save_raw", o->save_raw,
       "Also write the decoded images, float32 [N,H,W,3] in 0..1, as tensor 'images' of this safetensors file");
  flag(cmd, "--threads", o->threads, "Intra-op threads (default: all cores)")->check(in_range(1, 1024));
  cmd->callback([o, &chosen] { chosen = [o] { return run_generate(*o); }; });
}

}  // namespace sd::cli
