#include "core/threads.h"
#include "train/tasks/textual_inversion.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <torch/serialize.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <cstdio>
#include <map>
#include <random>

#include "core/error.h"
#include "core/progress.h"
#include "data/random_streams.h"
#include "data/sampler.h"
#include "data/textual_inversion_dataset.h"
#include "dist/communicator.h"
#include "dist/gradient_sync.h"
#include "dist/rendezvous.h"
#include "dist/signals.h"
#include "dist/threads.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "models/weights.h"
#include "pipeline/embedding_file.h"
#include "pipeline/stable_diffusion.h"
#include "pipeline/txt2img.h"
#include "schedulers/ddpm.h"
#include "schedulers/factory.h"
#include "io/image.h"
#include "train/adamw.h"
#include "train/checkpoints.h"
#include "train/lr_schedule.h"
#include "train/metrics_log.h"
#include "train/tasks/textual_inversion_step.h"

namespace sd::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void note(const std::string& text) { std::fprintf(stderr, "sdtrain: %s\n", text.c_str()); }

// 128 + the signal that stopped the run (SIGTERM when another rank was signalled), so a restart policy relaunches.
int stop_exit_code() { return 128 + (dist::stop_signal() ? dist::stop_signal() : SIGTERM); }

at::ScalarType weight_dtype_for(const std::string& mixed_precision, bool main_rank) {
  if (mixed_precision == "no") return at::kFloat;
  if (mixed_precision == "fp16" && main_rank)
    note(
        "--mixed_precision fp16: CPUs have no fast float16 kernels; the frozen UNet and VAE run in bf16 instead "
        "(same memory, float32's range)");
  return at::kBFloat16;
}

// The tokens the learned vectors occupy, added to the tokenizer; returns the first id (they are consecutive).
int64_t add_placeholder_tokens(text::ClipTokenizer& tokenizer, const TextualInversionOptions& o) {
  int64_t first = -1;
  for (const auto& token : pipeline::embedding_tokens(o.placeholder_token, o.num_vectors)) {
    SD_CHECK(!tokenizer.token_to_id(token).has_value(),
             "--placeholder_token: the tokenizer already contains the token '{}'; pass a different placeholder_token",
             token);
    const int64_t id = tokenizer.add_token(token);
    if (first < 0) first = id;
  }
  return first;
}

int64_t initializer_id(const text::ClipTokenizer& tokenizer, const std::string& token) {
  const std::vector<int64_t> ids = tokenizer.encode_tokens(token);
  SD_CHECK(ids.size() == 1, "--initializer_token '{}' must be a single token, but it is {} tokens", token, ids.size());
  return ids[0];
}

// A micro-batch with every random draw made from (seed, step, position in the global batch).
struct MicroBatch {
  at::Tensor mean, std, input_ids;
  TextualInversionDraws draws;
};

// The training state a checkpoint holds; everything random is a function of the seed and the step.
struct TrainState {
  int64_t global_step = 0;
  uint64_t seed = 0;
};

class Trainer {
 public:
  explicit Trainer(const TextualInversionOptions& o);
  int run();

 private:
  MicroBatch micro_batch(int64_t step, int64_t micro);
  const models::DiagonalGaussian& posterior(int64_t image, bool flip);
  double train_step();
  void save_embeddings(const fs::path& path) const;
  // learned_embeds<suffix>.safetensors, or .bin (a torch.save file) under --no_safe_serialization.
  fs::path embeddings_path(const std::string& suffix) const;
  void save_checkpoint();
  void load_checkpoint(const fs::path& dir);
  void save_full_pipeline();
  void write_learned_rows_into_text_encoder();
  void run_validation();
  bool is_main() const { return comm_->rank() == 0; }

  TextualInversionOptions o_;
  fs::path output_dir_;
  dist::DistEnv env_;
  std::shared_ptr<dist::Communicator> comm_;
  std::unique_ptr<pipeline::StableDiffusion> pipe_;
  int64_t first_placeholder_ = 0;
  std::unique_ptr<data::TextualInversionDataset> dataset_;
  std::unique_ptr<data::DistributedSampler> sampler_;
  data::BatchLayout layout_;
  std::unique_ptr<TextualInversionStep> step_;
  at::Tensor learned_;  // [num_vectors, D] float32
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<dist::GradientSync> sync_;
  LrSchedule schedule_;
  double base_lr_ = 0;
  int64_t max_steps_ = 0;
  TrainState state_;
  std::map<std::pair<int64_t, bool>, models::DiagonalGaussian> posteriors_;
  MetricsLog metrics_;
};

Trainer::Trainer(const TextualInversionOptions& o) : o_(o), output_dir_(o.output_dir) {
  env_ = dist::detect_dist_env();
  set_compute_threads(dist::threads_for_rank(o.threads, env_));
  dist::install_stop_signal_handlers();
  dist::CommOptions comm_options;
  comm_options.timeout = dist::timeout_from_seconds(o.dist_timeout_s);
  comm_options.iface = o.dist_iface;
  comm_ = dist::make_communicator(env_, comm_options);
  layout_ = {o.train_batch_size, o.gradient_accumulation_steps, comm_->world_size()};

  // Every rank must use the same seed: rank 0 draws one when none is given.
  at::Tensor seed = at::tensor(static_cast<int64_t>(o.seed.value_or(std::random_device{}() & 0x7fffffff)), at::kLong);
  comm_->broadcast(seed, 0);
  state_.seed = static_cast<uint64_t>(seed.item<int64_t>());

  const at::ScalarType weight_dtype = weight_dtype_for(o.mixed_precision, is_main());
  pipe_ = std::make_unique<pipeline::StableDiffusion>(pipeline::load_pipeline(
      o.pretrained_model_name_or_path, {at::kFloat, weight_dtype, weight_dtype}, o.tokenizer_name));
  const int64_t factor = pipe_->vae_scale_factor();
  SD_CHECK(o.resolution % factor == 0, "--resolution {} must be divisible by {} (the VAE's downscale factor)",
           o.resolution, factor);

  first_placeholder_ = add_placeholder_tokens(pipe_->tokenizer, o);
  const int64_t init_id = initializer_id(pipe_->tokenizer, o.initializer_token);
  pipe_->text_encoder->resize_token_embeddings(static_cast<int64_t>(pipe_->tokenizer.size()));
  for (int64_t i = 0; i < o.num_vectors; ++i)
    pipe_->text_encoder->copy_token_embedding_row(init_id, first_placeholder_ + i);
  learned_ = pipe_->text_encoder->token_embedding()
                 ->weight.detach()
                 .narrow(0, first_placeholder_, o.num_vectors)
                 .to(at::kFloat)
                 .clone()
                 .requires_grad_(true);

  data::TextualInversionDatasetOptions data_options;
  data_options.data_dir = o.train_data_dir;
  data_options.learnable_property = o.learnable_property;
  data_options.placeholder_string =
      fmt::format("{}", fmt::join(pipeline::embedding_tokens(o.placeholder_token, o.num_vectors), " "));
  data_options.resolution = o.resolution;
  data_options.center_crop = o.center_crop;
  data_options.repeats = o.repeats;
  dataset_ = std::make_unique<data::TextualInversionDataset>(data_options);
  sampler_ = std::make_unique<data::DistributedSampler>(dataset_->size(), layout_, state_.seed);
  max_steps_ = o.max_train_steps.value_or(o.num_train_epochs * sampler_->steps_per_epoch());
  SD_CHECK(max_steps_ >= 1, "--max_train_steps must be at least 1, got {}", max_steps_);

  schedulers::DDPMScheduler ddpm(pipe_->scheduler_config);
  step_ = std::make_unique<TextualInversionStep>(pipe_->text_encoder, pipe_->vae, pipe_->unet, ddpm.alphas_cumprod(),
                                                 pipe_->scheduler_config.prediction_type, first_placeholder_,
                                                 o.num_vectors);
  pipe_->unet->set_gradient_checkpointing(o.gradient_checkpointing);

  base_lr_ = o.learning_rate * (o.scale_lr ? static_cast<double>(layout_.global()) : 1.0);
  schedule_ = {o.lr_scheduler, o.lr_warmup_steps, max_steps_, o.lr_num_cycles};
  validate(schedule_);
  optimizer_ = std::make_unique<AdamW>(std::vector<at::Tensor>{learned_},
                                       AdamWOptions{o.adam_beta1, o.adam_beta2, o.adam_epsilon, o.adam_weight_decay});
  sync_ = std::make_unique<dist::GradientSync>(comm_, std::vector<at::Tensor>{learned_});

  if (auto checkpoint = resolve_checkpoint(output_dir_, o.resume_from_checkpoint)) {
    load_checkpoint(*checkpoint);
  } else if (!o.resume_from_checkpoint.empty() && is_main()) {
    note(fmt::format("no checkpoint in {} to resume from; starting a new training run", output_dir_.string()));
  }
  if (is_main()) {
    fs::create_directories(output_dir_);
    metrics_ = MetricsLog(output_dir_ / o.logging_dir / "metrics.jsonl");
    note(
        fmt::format("{} images x {} repeats, {} rank(s) x batch {} x accumulation {} = global batch {}; {} steps "
                    "from step {}, lr {:g}, seed {}, {} thread(s) per rank",
                    dataset_->num_images(), o.repeats, layout_.world, layout_.batch, layout_.accumulation,
                    layout_.global(), max_steps_, state_.global_step, base_lr_, state_.seed, at::get_num_threads()));
  }
}

const models::DiagonalGaussian& Trainer::posterior(int64_t image, bool flip) {
  // The VAE is frozen and deterministic: each (image, flip) is encoded once and its posterior reused.
  auto key = std::make_pair(image, flip);
  auto it = posteriors_.find(key);
  if (it == posteriors_.end())
    it = posteriors_.emplace(key, step_->encode(dataset_->pixel_values(image, flip).unsqueeze(0))).first;
  return it->second;
}

MicroBatch Trainer::micro_batch(int64_t step, int64_t micro) {
  using data::Stream;
  const std::vector<int64_t> indices = sampler_->micro_batch(step, micro, comm_->rank());
  std::vector<at::Tensor> means, stds, ids, eps, noise, timesteps;
  const int64_t num_train_timesteps = pipe_->scheduler_config.num_train_timesteps;
  for (size_t j = 0; j < indices.size(); ++j) {
    const auto position = static_cast<uint64_t>((micro * layout_.world + comm_->rank()) * layout_.batch + j);
    auto gen = [&](Stream s) { return data::stream_generator(state_.seed, s, static_cast<uint64_t>(step), position); };
    const bool flip = at::rand({1}, gen(Stream::kAugment)).item<float>() < 0.5f;
    const int64_t templ =
        at::randint(static_cast<int64_t>(dataset_->templates().size()), {1}, gen(Stream::kPrompt)).item<int64_t>();
    const auto& p = posterior(indices[j] % dataset_->num_images(), flip);
    means.push_back(p.mean);
    stds.push_back(p.std);
    ids.push_back(at::tensor(pipe_->tokenizer.encode(dataset_->prompt(templ))).unsqueeze(0));
    eps.push_back(at::randn(p.mean.sizes(), gen(Stream::kPosterior)));
    noise.push_back(at::randn(p.mean.sizes(), gen(Stream::kNoise)));
    timesteps.push_back(at::randint(num_train_timesteps, {1}, gen(Stream::kTimestep)));
  }
  return {at::cat(means), at::cat(stds), at::cat(ids), {at::cat(eps), at::cat(noise), at::cat(timesteps)}};
}

double Trainer::train_step() {
  double loss_sum = 0;
  for (int64_t micro = 0; micro < layout_.accumulation; ++micro) {
    MicroBatch b = micro_batch(state_.global_step, micro);
    at::Tensor loss = step_->forward(b.mean, b.std, b.input_ids, b.draws, learned_).loss;
    loss_sum += loss.item<double>();
    if (micro == layout_.accumulation - 1) sync_->prepare_for_backward();
    (loss / static_cast<double>(layout_.accumulation)).backward();
  }
  sync_->finish();
  optimizer_->step(base_lr_ * lr_multiplier(schedule_, state_.global_step, base_lr_));
  optimizer_->zero_grad();
  at::Tensor loss = at::tensor(loss_sum / static_cast<double>(layout_.accumulation));
  std::vector<at::Tensor> losses{loss};
  comm_->allreduce_mean(losses);
  return losses[0].item<double>();
}

fs::path Trainer::embeddings_path(const std::string& suffix) const {
  return output_dir_ / ("learned_embeds" + suffix + (o_.no_safe_serialization ? ".bin" : ".safetensors"));
}

void Trainer::save_embeddings(const fs::path& path) const {
  const at::Tensor rows = learned_.detach().clone();
  if (path.extension() != ".bin") {
    io::save_safetensors(path, {{o_.placeholder_token, rows}}, {{"format", "pt"}});
    return;
  }
  // What the reference's torch.save writes: a dict {token: tensor} that torch.load reads.
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert(o_.placeholder_token, rows);
  const std::vector<char> bytes = torch::pickle_save(dict);
  io::write_atomically(path, [&](const fs::path& tmp) {
    std::ofstream out(tmp, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    SD_CHECK(out.good(), "{}: could not write", tmp.string());
  });
}

void Trainer::save_checkpoint() {
  const fs::path dir = output_dir_ / fmt::format("checkpoint-{}", state_.global_step);
  enforce_total_limit(output_dir_, o_.checkpoints_total_limit);
  write_directory_atomically(dir, [&](const fs::path& tmp) {
    save_embeddings(tmp / "learned_embeds.safetensors");
    io::save_safetensors(tmp / "optimizer.safetensors", optimizer_->state(), {});
    const json state = {{"global_step", state_.global_step},
                        {"seed", state_.seed},
                        {"placeholder_token", o_.placeholder_token},
                        {"num_vectors", o_.num_vectors},
                        {"global_batch", layout_.global()}};
    io::write_text_file(tmp / "training_state.json", state.dump(2) + "\n");
  });
}

void Trainer::load_checkpoint(const fs::path& dir) {
  const auto state = io::JsonConfig::load(dir / "training_state.json");
  SD_CHECK(state.require<std::string>("placeholder_token") == o_.placeholder_token &&
               state.require<int64_t>("num_vectors") == o_.num_vectors,
           "{}: the checkpoint learned '{}' with {} vector(s), this run '{}' with {}", dir.string(),
           state.require<std::string>("placeholder_token"), state.require<int64_t>("num_vectors"), o_.placeholder_token,
           o_.num_vectors);
  if (state.require<int64_t>("global_batch") != layout_.global() && is_main())
    note(fmt::format("{}: the global batch changes from {} to {}; the data order will differ from the original run",
                     dir.string(), state.require<int64_t>("global_batch"), layout_.global()));
  pipeline::EmbeddingFile embeds = pipeline::load_embedding_file(dir / "learned_embeds.safetensors");
  SD_CHECK(embeds.vectors.sizes() == learned_.sizes(), "{}: learned embedding has shape [{}], expected [{}]",
           dir.string(), fmt::join(embeds.vectors.sizes(), ", "), fmt::join(learned_.sizes(), ", "));
  {
    torch::NoGradGuard no_grad;
    learned_.copy_(embeds.vectors);
  }
  optimizer_->load_state(io::load_safetensors(dir / "optimizer.safetensors"), (dir / "optimizer.safetensors").string());
  state_.global_step = state.require<int64_t>("global_step");
  state_.seed = static_cast<uint64_t>(state.require<int64_t>("seed"));
  sampler_ = std::make_unique<data::DistributedSampler>(dataset_->size(), layout_, state_.seed);
  if (is_main()) note(fmt::format("resuming from {} (step {})", dir.string(), state_.global_step));
}

void Trainer::write_learned_rows_into_text_encoder() {
  torch::NoGradGuard no_grad;
  pipe_->text_encoder->token_embedding()->weight.narrow(0, first_placeholder_, o_.num_vectors).copy_(learned_);
}

void Trainer::run_validation() {
  // As the reference's log_validation: DPM-Solver++ from the pipeline's scheduler config, 25 steps, the run's seed.
  write_learned_rows_into_text_encoder();
  auto scheduler = schedulers::make_scheduler(pipe_->scheduler_config, "DPMSolverMultistepScheduler");
  pipeline::Txt2ImgOptions options;
  options.prompts = {o_.validation_prompt};
  options.num_inference_steps = 25;
  options.num_images_per_prompt = o_.num_validation_images;
  options.seed = state_.seed;
  options.height = options.width = o_.resolution;
  const at::Tensor images = pipeline::txt2img(*pipe_, *scheduler, options).images_uint8;
  for (int64_t i = 0; i < images.size(0); ++i)
    io::save_png(output_dir_ / "validation" / fmt::format("step-{}-{}.png", state_.global_step, i),
                 pipeline::to_rgb_image(images[i]));
}

void Trainer::save_full_pipeline() {
  // The UNet, VAE and scheduler are unchanged: their files are copied as they are (full precision), and only the
  // tokenizer and the text encoder, which gained the learned token rows, are written anew.
  write_learned_rows_into_text_encoder();
  const fs::path source = o_.pretrained_model_name_or_path;
  for (const char* part : {"unet", "vae", "scheduler"}) {
    write_directory_atomically(output_dir_ / part, [&](const fs::path& tmp) {
      fs::copy(source / part, tmp, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    });
  }
  write_directory_atomically(output_dir_ / "tokenizer", [&](const fs::path& tmp) { pipe_->tokenizer.save(tmp); });
  write_directory_atomically(output_dir_ / "text_encoder",
                             [&](const fs::path& tmp) { models::save_text_encoder(pipe_->text_encoder, tmp); });
  const std::string scheduler_class = pipe_->model_index["scheduler"][1].get<std::string>();
  io::write_text_file(output_dir_ / "model_index.json", pipeline::model_index_json(scheduler_class).dump(2) + "\n");
}

int Trainer::run() {
  ProgressBar bar("textual-inversion", max_steps_, state_.global_step);
  if (!is_main()) bar.finish();
  while (state_.global_step < max_steps_) {
    const auto started = std::chrono::steady_clock::now();
    const double lr = base_lr_ * lr_multiplier(schedule_, state_.global_step, base_lr_);
    const double loss = train_step();
    state_.global_step += 1;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const bool stopping = dist::any_rank_stopping(*comm_);
    if (!is_main()) {
      if (stopping) return stop_exit_code();
      continue;
    }
    metrics_.write({{"step", state_.global_step},
                    {"epoch", (state_.global_step - 1) / sampler_->steps_per_epoch()},
                    {"loss", loss},
                    {"lr", lr},
                    {"step_time_s", seconds},
                    {"images_per_s", static_cast<double>(layout_.global()) / seconds}});
    bar.update(state_.global_step, fmt::format("loss {:.4f} lr {:.2e}", loss, lr));
    if (state_.global_step % o_.save_steps == 0)
      save_embeddings(embeddings_path(fmt::format("-steps-{}", state_.global_step)));
    if (state_.global_step % o_.checkpointing_steps == 0 || stopping) save_checkpoint();
    if (!o_.validation_prompt.empty() && state_.global_step % o_.validation_steps == 0 && !stopping) run_validation();
    if (stopping) {
      bar.finish();
      note(fmt::format("stopped at step {}: checkpoint-{} written; resume with --resume_from_checkpoint latest",
                       state_.global_step, state_.global_step));
      return stop_exit_code();
    }
  }
  bar.finish();
  if (is_main()) {
    if (o_.save_as_full_pipeline) save_full_pipeline();
    save_embeddings(embeddings_path(""));
    std::printf("%s\n", embeddings_path("").c_str());
  }
  comm_->barrier();
  return 0;
}

}  // namespace

int run_textual_inversion(const TextualInversionOptions& options) {
  Trainer trainer(options);
  return trainer.run();
}

}  // namespace sd::train
