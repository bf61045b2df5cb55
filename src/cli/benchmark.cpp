// `sdtrain benchmark`: how fast a configuration trains (or generates) on this machine and how close that is to what
// the machine can do. It runs the real training loop (or txt2img) on synthetic data, under any launcher, and prints
// one JSON line per rank on stdout and a summary on stderr: seconds per step (median after warm-up), images per
// second over all ranks, FLOPs per step from the analytic count, achieved GFLOP/s, MFU against the bf16 and float32
// GEMM peaks measured in the same run, peak resident memory, the time by op class (perf/op_profiler.h) and the bytes
// the machine's network interfaces carried per step (bench_netns_scaling compares them with the ideal); for
// generation also the VAE decode after the last step.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_flags.h"
#include "cli/training_flags.h"
#include "core/error.h"
#include "core/log.h"
#include "core/threads.h"
#include "dist/rendezvous.h"
#include "io/image.h"
#include "models/unet/unet_2d_condition.h"
#include "perf/machine.h"
#include "perf/op_profiler.h"
#include "pipeline/presets.h"
#include "pipeline/model_source.h"
#include "pipeline/txt2img.h"
#include "schedulers/factory.h"
#include "train/precision.h"
#include "train/tasks/textual_inversion.h"
#include "train/tasks/lora_training.h"

namespace sd::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct BenchmarkOptions {
  std::string task = "unet";
  pipeline::ModelRequest model;
  std::string preset = "sd15";
  int resolution = 256;
  int64_t train_batch_size = 1;
  int gradient_accumulation_steps = 1;
  std::string mixed_precision = "bf16";
  int steps = 5;
  int warmup = 2;
  std::string sharding = "no_shard";
  double bucket_cap_mb = 25;
  models::UNetMemoryOptions unet_memory;
  std::optional<int64_t> lora_rank;  // unet: train LoRA adapters of this rank instead of the whole UNet
  std::string data = "latents";
  bool use_ema = false;  // unet: keep an EMA of the trained weights
  int num_inference_steps = 10;
  bool profile = true;
  std::optional<int> threads;
  double dist_timeout_s = 600;
  std::string dist_transport = "auto";
};

// What the measured steps give; everything per rank unless said otherwise.
struct Measurement {
  std::vector<double> step_seconds;  // measured steps only
  int64_t peak_rss = 0;
  int64_t huge_pages = 0;  // resident in transparent huge pages at the end
  perf::OpProfile profile;
  perf::NetworkBytes network;   // over the measured steps, through this machine's interfaces
  int64_t flops_per_step = 0;   // this rank's share
  int64_t images_per_step = 0;  // over all ranks
  int world = 1, rank = 0;
  std::optional<double> decode_seconds;  // generate: from the last denoising step to the images (VAE decode)
};

// Steps before `warmup` run untimed; from then on the profiler records and the peak-memory mark restarts.
class StepMeter {
 public:
  StepMeter(const BenchmarkOptions& o, Measurement& m) : o_(o), m_(m) {}
  void before(int64_t step) {
    if (step != o_.warmup) return;
    perf::reset_peak_rss();
    network_start_ = perf::network_bytes();
    if (o_.profile) profiler_.emplace(/*count_flops=*/true);
  }
  void after(int64_t step, double seconds) {
    if (step <= o_.warmup) return;
    m_.step_seconds.push_back(seconds);
    if (static_cast<int>(m_.step_seconds.size()) == o_.steps) finish();
  }

 private:
  void finish() {
    m_.peak_rss = perf::peak_rss_bytes();
    m_.huge_pages = perf::huge_page_bytes();
    const perf::NetworkBytes now = perf::network_bytes();
    m_.network = {now.sent - network_start_.sent, now.received - network_start_.received};
    if (profiler_) m_.profile = profiler_->profile();
    profiler_.reset();
  }
  const BenchmarkOptions& o_;
  Measurement& m_;
  std::optional<perf::OpProfiler> profiler_;
  perf::NetworkBytes network_start_;
};

// A random-weight pipeline of the preset, written once (bf16 weights) under the user's cache folder and reused.
fs::path preset_dir(const std::string& preset) {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path cache = xdg && *xdg ? fs::path(xdg) : fs::path(home ? home : "/tmp") / ".cache";
  const fs::path dir = cache / "sdtrain" / "presets" / (preset + "-bf16");
  if (!fs::exists(dir / "model_index.json")) {
    log::info("writing a random {} pipeline to {} (once)", preset, dir.string());
    pipeline::write_preset(preset, 0, dir, at::kBFloat16);
  }
  return dir;
}

train::TrainerOptions trainer_options(const BenchmarkOptions& o, StepMeter& meter) {
  train::TrainerOptions t;
  t.train_batch_size = o.train_batch_size;
  t.gradient_accumulation_steps = o.gradient_accumulation_steps;
  t.bucket_cap_mb = o.bucket_cap_mb;
  t.max_train_steps = o.warmup + o.steps;
  t.mixed_precision = o.mixed_precision;
  t.sharding = o.sharding;
  t.seed = 0;
  t.threads = o.threads;
  t.dist_timeout_s = o.dist_timeout_s;
  t.dist_transport = o.dist_transport;
  t.lr_warmup_steps = 0;
  t.use_ema = o.use_ema;
  t.measure_only = true;
  t.before_each_step = [&meter](int64_t step) { meter.before(step); };
  t.after_each_step = [&meter](const train::StepReport& r, double seconds) { meter.after(r.step, seconds); };
  return t;
}

void measure_unet_training(const BenchmarkOptions& o, const pipeline::ModelRequest& model, Measurement& m) {
  StepMeter meter(o, m);
  train::LoraTrainingOptions u;  // the UNet options, plus LoRA's for --lora_rank
  u.training = trainer_options(o, meter);
  u.model = model;
  u.data.synthetic_data = o.data;
  u.data.synthetic_samples = 1 << 20;
  u.data.transform.resolution = o.resolution;
  u.unet_memory = o.unet_memory;
  if (o.lora_rank) u.lora_rank = *o.lora_rank;
  SD_CHECK((o.lora_rank ? train::run_lora_training(u) : train::run_unet_training(u)) == 0,
           "the benchmark's training run failed");
}

void measure_textual_inversion(const BenchmarkOptions& o, const pipeline::ModelRequest& model, const fs::path& work,
                               Measurement& m) {
  for (int i = 0; i < 4; ++i) {
    io::RgbImage image{o.resolution, o.resolution,
                       std::vector<uint8_t>(static_cast<size_t>(o.resolution) * o.resolution * 3)};
    for (size_t p = 0; p < image.pixels.size(); ++p) image.pixels[p] = static_cast<uint8_t>((p * (3 + i)) % 241);
    io::save_png(work / "images" / fmt::format("img{}.png", i), image);
  }
  StepMeter meter(o, m);
  train::TextualInversionOptions t;
  t.training = trainer_options(o, meter);
  t.model = model;
  t.train_data_dir = (work / "images").string();
  t.placeholder_token = "<benchmark>";
  t.initializer_token = "toy";
  t.resolution = o.resolution;
  t.unet_memory = o.unet_memory;
  SD_CHECK(train::run_textual_inversion(t) == 0, "the benchmark's training run failed");
}

void measure_generation(const BenchmarkOptions& o, const pipeline::ModelSource& model, Measurement& m) {
  set_compute_threads(o.threads.value_or(static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))));
  const train::PrecisionPolicy precision = train::PrecisionPolicy::from_flag(o.mixed_precision);
  pipeline::StableDiffusion pipe = pipeline::load_pipeline(model, {at::kFloat, precision.frozen, precision.frozen});
  auto scheduler = schedulers::make_scheduler(pipe.scheduler_config);
  pipeline::Txt2ImgOptions options;
  options.prompts = {"a photograph of an astronaut riding a horse"};
  options.num_inference_steps = o.num_inference_steps;
  options.height = options.width = o.resolution;
  options.num_images_per_prompt = o.train_batch_size;
  // One generation to warm up, one measured; a step is one denoising step (the UNet on the guided batch).
  pipeline::txt2img(pipe, *scheduler, options);
  BenchmarkOptions counted = o;
  counted.steps = static_cast<int>(scheduler->timesteps().size(0));  // PNDM runs one step more than asked
  StepMeter meter(counted, m);
  auto last = std::chrono::steady_clock::now();
  pipeline::Txt2ImgHooks hooks;
  hooks.on_progress = [&](int done, int total) {
    const auto now = std::chrono::steady_clock::now();
    meter.after(o.warmup + done, std::chrono::duration<double>(now - last).count());
    last = now;
  };
  meter.before(o.warmup);
  pipeline::txt2img(pipe, *scheduler, options, hooks);
  m.decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - last).count();
}

int64_t micro_batches(const BenchmarkOptions& o) { return o.task == "generate" ? 1 : o.gradient_accumulation_steps; }

// FLOPs of one measured step in UNet forward passes of a batch: full training runs the forward, then backward for
// activations and for weights (3x); a LoRA step skips the frozen weights' gradients (2x; the adapters' own work is
// well under 1% of it), as does textual inversion's frozen UNet (2x); a guided denoising step runs the forward on the
// unconditional and conditional halves of the batch (2x). A training step runs that for each micro-batch. The
// latents are the images shrunk by the VAE's factor (8 for SD, 4 for tiny-sd1's three-block VAE).
int64_t flops_per_step(const BenchmarkOptions& o, const pipeline::PipelineConfigs& configs) {
  const int64_t passes = micro_batches(o) * (o.task == "unet" && !o.lora_rank ? 3 : 2);
  const int64_t latent = o.resolution / configs.vae.scale_factor();
  return passes * models::count_forward_flops(configs.unet, o.train_batch_size, latent, latent);
}

// The `n` ops (LibTorch ops, autograd nodes, sdtrain scopes) with the largest `value(totals) / divisor`, largest
// first.
json top_ops(const perf::OpProfile& profile, size_t n, double (*value)(const perf::OpTotals&), double divisor) {
  std::vector<std::pair<double, std::string>> ops;
  for (const auto& [name, totals] : profile.by_op) ops.emplace_back(value(totals) / divisor, name);
  std::sort(ops.rbegin(), ops.rend());
  json top = json::array();
  for (size_t i = 0; i < std::min(n, ops.size()); ++i) top.push_back({ops[i].second, ops[i].first});
  return top;
}

double self_seconds(const perf::OpTotals& t) { return t.self_seconds; }
double calls(const perf::OpTotals& t) { return static_cast<double>(t.calls); }

// Every op, autograd node and sdtrain scope the profiler saw, per step (none without the profiler): what a small
// model's step costs is mostly the few microseconds each of them takes to dispatch.
std::optional<double> ops_per_step(const perf::OpProfile& profile, size_t steps) {
  if (profile.by_op.empty()) return std::nullopt;
  int64_t total = 0;
  for (const auto& [name, totals] : profile.by_op) total += totals.calls;
  return static_cast<double>(total) / static_cast<double>(steps);
}

// Achieved GFLOP/s of each op class that does matrix products, from the profiler's counts and times.
json op_rates(const perf::OpProfile& profile) {
  json rates = json::object();
  for (const auto& [name, flops] : profile.flops)
    if (profile.seconds.count(name) && profile.seconds.at(name) > 0)
      rates[name] = static_cast<double>(flops) / profile.seconds.at(name) / 1e9;
  return rates;
}

// The op classes that do matrix products (convolutions, linear layers, attention) taken together: their seconds per
// step, GFLOP/s and share of the GEMM peak. Against the step's MFU it tells the products' own speed from what the
// step spends without counted FLOPs (the optimizer's memory-bound pass, elementwise ops, communication).
json products_rate(const perf::OpProfile& profile, size_t steps, double peak_gflops) {
  double seconds = 0;
  std::vector<std::string> classes;
  for (const auto& [name, flops] : profile.flops)
    if (profile.seconds.count(name)) {
      seconds += profile.seconds.at(name);
      classes.push_back(name);
    }
  if (seconds <= 0) return json();
  const double gflops = static_cast<double>(profile.matmul_flops) / seconds / 1e9;
  return {{"op_classes", classes},
          {"seconds_per_step", seconds / static_cast<double>(steps)},
          {"gflops_per_s", gflops},
          {"share_of_peak", gflops / peak_gflops}};
}

// The `n` products (convolutions, matrix products, attention by input shapes) taking the most time, most first: per
// step their calls and milliseconds, and the GFLOP/s they ran at. Where a step's time goes, shape by shape.
std::vector<json> top_products(const perf::OpProfile& profile, size_t n, size_t steps) {
  std::vector<std::pair<double, std::string>> by_time;
  for (const auto& [name, totals] : profile.products) by_time.emplace_back(totals.seconds, name);
  std::sort(by_time.rbegin(), by_time.rend());
  std::vector<json> top;
  const auto per_step = [&](double x) { return x / static_cast<double>(steps); };
  for (size_t i = 0; i < std::min(n, by_time.size()); ++i) {
    const perf::ProductTotals& t = profile.products.at(by_time[i].second);
    top.push_back({{"op", by_time[i].second},
                   {"calls_per_step", per_step(static_cast<double>(t.calls))},
                   {"ms_per_step", per_step(1e3 * t.seconds)},
                   {"gflops_per_s", t.seconds > 0 ? static_cast<double>(t.flops) / t.seconds / 1e9 : 0.0}});
  }
  return top;
}

// What the run trains besides the task's defaults, for the summary line: " (LoRA rank 4, EMA)", or nothing.
std::string training_extras(const BenchmarkOptions& o) {
  std::string extras;
  if (o.lora_rank) extras = fmt::format("LoRA rank {}", *o.lora_rank);
  if (o.use_ema) extras += extras.empty() ? "EMA" : ", EMA";
  return extras.empty() ? "" : " (" + extras + ")";
}

const char* dtype_name(at::ScalarType t) { return t == at::kBFloat16 ? "bf16" : "float32"; }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int run_benchmark(BenchmarkOptions o) {
  SD_CHECK(o.steps >= 1 && o.warmup >= 0, "--steps must be >= 1 and --warmup >= 0");
  SD_CHECK(o.resolution > 0 && o.resolution % 8 == 0, "--resolution {} must be a positive multiple of 8", o.resolution);
  SD_CHECK(!o.lora_rank || o.task == "unet", "--lora_rank is for --task unet, not {}", o.task);
  SD_CHECK(!o.use_ema || o.task == "unet", "--use_ema is for --task unet, not {}", o.task);
  SD_CHECK(o.data == "latents" || o.task == "unet", "--data {} is for --task unet, not {}", o.data, o.task);
  SD_CHECK(o.task != "generate" || (o.sharding == "no_shard" && o.gradient_accumulation_steps == 1),
           "--sharding and --gradient_accumulation_steps are for training tasks, not --task generate");
  const bool preset = o.model.name_or_path.empty();
  const std::string model_name = preset ? o.preset : o.model.name_or_path;
  pipeline::ModelRequest model = o.model;
  if (preset) model.name_or_path = preset_dir(o.preset).string();
  const pipeline::ModelSource source = pipeline::resolve_model(model);
  const fs::path work = fs::temp_directory_path() / fmt::format("sdtrain-benchmark-{}", getpid());
  Measurement m;
  if (o.task == "unet")
    measure_unet_training(o, model, m);
  else if (o.task == "textual-inversion")
    measure_textual_inversion(o, model, work, m);
  else
    measure_generation(o, source, m);
  fs::remove_all(work);
  SD_CHECK(!m.step_seconds.empty(), "no step was measured");
  m.flops_per_step = flops_per_step(o, pipeline::read_configs(source));
  // (MosaicML's line counts the whole UNet as trainable; a LoRA run logs its own count instead.)
  if (o.task == "unet" && !o.lora_rank && dist::detect_dist_env().rank == 0)
    log::info("{}", pipeline::parameter_line(pipeline::summarize_components(source)));

  // Generation runs in one process; training on every rank the launcher started.
  m.world = o.task == "generate" ? 1 : dist::detect_dist_env().world_size;
  // Peaks with the threads the run used (the training run sized the pool for this rank).
  const double bf16_peak = perf::gemm_gflops(at::kBFloat16), fp32_peak = perf::gemm_gflops(at::kFloat);
  const double seconds = median(m.step_seconds);
  const size_t steps = m.step_seconds.size();
  const std::optional<double> ops = ops_per_step(m.profile, steps);
  const std::vector<json> products = top_products(m.profile, 25, steps);
  // A training step takes a batch per micro-batch and rank; a generation takes all its denoising steps for one batch.
  const double images_per_s = static_cast<double>(o.train_batch_size * micro_batches(o) * m.world) /
                              (o.task == "generate" ? seconds * static_cast<double>(steps) : seconds);
  const double gflops = static_cast<double>(m.flops_per_step) / seconds / 1e9;
  const train::PrecisionPolicy precision = train::PrecisionPolicy::from_flag(o.mixed_precision);
  const double compute_peak = precision.compute == at::kBFloat16 ? bf16_peak : fp32_peak;
  const json product_rate = products_rate(m.profile, steps, compute_peak);
  const std::string cpu_model = perf::cpu_model_name();
  json line = {{"task", o.task},
               {"lora_rank", o.lora_rank ? json(*o.lora_rank) : json()},
               {"use_ema", o.use_ema},
               {"model", model_name},
               {"resolution", o.resolution},
               {"train_batch_size", o.train_batch_size},
               {"gradient_accumulation_steps", micro_batches(o)},
               {"mixed_precision", o.mixed_precision},
               {"compute_dtype", dtype_name(precision.compute)},
               {"sharding", o.sharding},
               {"bucket_cap_mb", o.bucket_cap_mb},
               {"world_size", m.world},
               {"threads", at::get_num_threads()},
               {"cpu", {{"model", cpu_model}, {"kind", perf::cpu_kind()}}},
               {"s_per_step", seconds},
               {"step_seconds", m.step_seconds},
               {"images_per_s", images_per_s},
               {"flops_per_step", m.flops_per_step},
               {"achieved_gflops", gflops},
               {"gemm_peak_gflops", {{"bf16", bf16_peak}, {"float32", fp32_peak}}},
               {"mfu", gflops / compute_peak},
               {"decode_seconds", m.decode_seconds ? json(*m.decode_seconds) : json()},
               {"peak_rss_gib", static_cast<double>(m.peak_rss) / (1 << 30)},
               {"huge_pages_gib", static_cast<double>(m.huge_pages) / (1 << 30)},
               {"op_seconds", m.profile.seconds},
               {"op_gflops_per_s", op_rates(m.profile)},
               {"products", product_rate},
               {"top_ops_seconds", top_ops(m.profile, 15, self_seconds, 1)},
               {"ops_per_step", ops ? json(*ops) : json()},
               {"top_ops_calls_per_step", top_ops(m.profile, 15, calls, static_cast<double>(steps))},
               {"top_products", products},
               {"network_bytes_per_step",
                {{"sent", static_cast<double>(m.network.sent) / static_cast<double>(steps)},
                 {"received", static_cast<double>(m.network.received) / static_cast<double>(steps)}}}};
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
  log::info(
      "{}{} {} {}² batch {} {} ({} compute), {} rank(s) x {} thread(s): {:.3f} s/step, {:.2f} images/s, "
      "{:.1f} GFLOP/s = {:.0f}% of the {} GEMM peak ({:.0f} GFLOP/s; bf16 {:.0f}, float32 {:.0f}), peak {:.2f} GiB; "
      "{} ({})",
      o.task, training_extras(o), model_name, o.resolution, o.train_batch_size, o.mixed_precision,
      dtype_name(precision.compute), m.world, at::get_num_threads(), seconds, images_per_s, gflops,
      100 * gflops / compute_peak, dtype_name(precision.compute), compute_peak, bf16_peak, fp32_peak,
      static_cast<double>(m.peak_rss) / (1 << 30), cpu_model, perf::cpu_kind());
  if (m.decode_seconds) log::info("VAE decode and conversion to images: {:.3f} s", *m.decode_seconds);
  if (!m.profile.seconds.empty()) {
    double measured = 0;
    for (double s : m.step_seconds) measured += s;
    std::string split;
    const json rates = op_rates(m.profile);
    for (const auto& [name, s] : m.profile.seconds) {
      split += fmt::format("{}{} {:.0f}%", split.empty() ? "" : ", ", name, 100 * s / measured);
      if (rates.contains(name)) split += fmt::format(" ({:.0f} GFLOP/s)", rates[name].get<double>());
    }
    log::info("time by op class: {}; {:.0f} ops per step", split, ops.value_or(0));
    if (!product_rate.is_null())
      log::info("products ({}): {:.0f}% of the step at {:.0f} GFLOP/s = {:.0f}% of the {} GEMM peak",
                fmt::join(product_rate["op_classes"].get<std::vector<std::string>>(), ", "),
                100 * product_rate["seconds_per_step"].get<double>() * static_cast<double>(steps) / measured,
                product_rate["gflops_per_s"].get<double>(), 100 * product_rate["share_of_peak"].get<double>(),
                dtype_name(precision.compute));
    std::string largest;
    for (size_t i = 0; i < std::min<size_t>(5, products.size()); ++i)
      largest += fmt::format("{}{} ({:.0f}x) {:.1f} ms at {:.0f} GFLOP/s", largest.empty() ? "" : "; ",
                             products[i]["op"].get<std::string>(), products[i]["calls_per_step"].get<double>(),
                             products[i]["ms_per_step"].get<double>(), products[i]["gflops_per_s"].get<double>());
    if (!largest.empty()) log::info("largest products per step: {}", largest);
  }
  return 0;
}

}  // namespace

void add_benchmark(CLI::App& app, std::function<int()>& chosen) {
  auto* cmd = app.add_subcommand(
      "benchmark", "Measure training or generation speed, MFU and memory on synthetic data (one JSON line per rank)");
  auto o = std::make_shared<BenchmarkOptions>();
  flag(cmd, "--task", o->task, "What to measure")->check(CLI::IsMember({"unet", "textual-inversion", "generate"}));
  add_model_flags(cmd, "--model", o->model, "Options");
  flag(cmd, "--preset", o->preset, "Architecture of the random pipeline used without --model")
      ->check(CLI::IsMember(pipeline::preset_names()));
  flag(cmd, "--resolution", o->resolution, "Image size")->check(in_range(8, 16384));
  flag(cmd, "--train_batch_size", o->train_batch_size, "Images per rank per step (generate: images per prompt)")
      ->check(in_range(1, 65536));
  flag(cmd, "--mixed_precision", o->mixed_precision, "no or bf16")->check(CLI::IsMember({"no", "bf16"}));
  flag(cmd, "--steps", o->steps, "Measured steps (generate: --num_inference_steps)")->check(in_range(1, 10000));
  flag(cmd, "--warmup", o->warmup, "Untimed steps first")->check(in_range(0, 10000));
  flag(cmd, "--gradient_accumulation_steps", o->gradient_accumulation_steps, "Micro-batches per rank per step")
      ->check(in_range(1, 65536));
  flag(cmd, "--sharding", o->sharding, "no_shard or shard_grad_op (training)")
      ->check(CLI::IsMember({"no_shard", "shard_grad_op"}));
  flag(cmd, "--bucket_cap_mb", o->bucket_cap_mb, "MiB of float32 gradients per communication bucket (training)")
      ->check(positive_number());
  add_unet_memory_flags(cmd, o->unet_memory, "Options");
  flag(cmd, "--lora_rank", o->lora_rank,
       "unet: train LoRA adapters of this rank (diffusers' defaults) instead of the UNet")
      ->check(in_range(1, 4096));
  flag(cmd, "--data", o->data, "unet: latents (the UNet alone) or images (VAE and text encoder too, on random images)")
      ->check(CLI::IsMember({"latents", "images"}));
  switch_flag(cmd, "--use_ema", o->use_ema,
              "unet: keep an EMA of the trained weights (diffusers' EMAModel), as long training runs do");
  flag(cmd, "--num_inference_steps", o->num_inference_steps, "generate: denoising steps")->check(in_range(1, 10000));
  cmd->add_flag("--profile,!--no_profile", o->profile, "Time by op class (LibTorch's RecordFunction hooks)")
      ->capture_default_str();
  flag(cmd, "--threads", o->threads, "Intra-op threads per rank (default: cores / ranks on this node)")
      ->check(in_range(1, 1024));
  flag(cmd, "--dist_timeout", o->dist_timeout_s, "Seconds before a lost or hung peer ends the run");
  dist_transport_flag(cmd, o->dist_transport);
  cmd->callback([o, &chosen] { chosen = [o] { return run_benchmark(*o); }; });
}

}  // namespace sd::cli
