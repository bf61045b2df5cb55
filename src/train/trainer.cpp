#include "train/trainer.h"

#include <ATen/Parallel.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <random>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/threads.h"
#include "dist/rendezvous.h"
#include "dist/signals.h"
#include "dist/threads.h"
#include "io/atomic_file.h"
#include "io/image.h"
#include "io/json_config.h"
#include "perf/op_profiler.h"
#include "pipeline/stable_diffusion.h"
#include "pipeline/txt2img.h"
#include "train/checkpoints.h"
#include "train/run_agreement.h"

namespace sd::train {

namespace fs = std::filesystem;
using nlohmann::json;

json TrainingState::to_json() const {
  return {{"global_step", step},
          {"seed", seed},
          {"global_batch", global_batch},
          {"samples_seen", samples_seen},
          {"nonfinite_steps_skipped", nonfinite_steps_skipped},
          {"dataset_size", dataset_size},
          {"data_step_offset", data_step_offset}};
}

TrainingState TrainingState::from_json(const json& j, const std::string& source) {
  TrainingState s;
  try {
    s.step = j.at("global_step").get<int64_t>();
    s.seed = j.at("seed").get<uint64_t>();
    s.global_batch = j.at("global_batch").get<int64_t>();
    s.samples_seen = j.value("samples_seen", s.step * s.global_batch);
    s.nonfinite_steps_skipped = j.value("nonfinite_steps_skipped", int64_t{0});
    s.dataset_size = j.value("dataset_size", int64_t{0});
    s.data_step_offset = j.value("data_step_offset", int64_t{0});
  } catch (const json::exception& e) {
    fail("{}: training state is incomplete or malformed ({})", source, e.what());
  }
  SD_CHECK(s.step >= 0 && s.global_batch >= 1 && s.samples_seen >= 0 && s.nonfinite_steps_skipped >= 0 &&
               s.dataset_size >= 0,
           "{}: training state has step {}, global batch {}, {} samples seen, {} skipped steps and a dataset of {}",
           source, s.step, s.global_batch, s.samples_seen, s.nonfinite_steps_skipped, s.dataset_size);
  return s;
}

namespace {

// Micro-batches per step: --gradient_accumulation_steps, or what --global_batch_size implies.
int64_t accumulation_for(const TrainerOptions& o, int world) {
  SD_CHECK(o.train_batch_size >= 1, "--train_batch_size must be at least 1, got {}", o.train_batch_size);
  if (!o.global_batch_size) {
    SD_CHECK(o.gradient_accumulation_steps >= 1, "--gradient_accumulation_steps must be at least 1, got {}",
             o.gradient_accumulation_steps);
    return o.gradient_accumulation_steps;
  }
  const int64_t per_step = o.train_batch_size * world;
  SD_CHECK(*o.global_batch_size >= per_step && *o.global_batch_size % per_step == 0,
           "--global_batch_size {} must be a multiple of --train_batch_size {} x {} rank(s) = {}", *o.global_batch_size,
           o.train_batch_size, world, per_step);
  return *o.global_batch_size / per_step;
}

// 128 + the signal that stopped the run (on every rank, whichever was signalled), so a restart policy relaunches.
int stop_exit_code() { return 128 + (dist::run_stop_signal() ? dist::run_stop_signal() : SIGTERM); }

}  // namespace

RunContext start_run(const TrainerOptions& o) {
  const dist::DistEnv env = dist::detect_dist_env();
  dist::install_stop_signal_handlers();
  dist::CommOptions comm_options;
  comm_options.timeout = dist::timeout_from_seconds(o.dist_timeout_s);
  comm_options.iface = o.dist_iface;
  comm_options.transport = o.dist_transport;
  RunContext context;
  context.comm = dist::make_communicator(env, comm_options);
  set_compute_threads(dist::threads_for_rank_among_peers(o.threads, env, *context.comm));
  // Every rank writes its part of each checkpoint there; after the rendezvous, so that the others hear of a failure
  // at once instead of waiting for this rank to join.
  if (!o.measure_only && !o.output_dir.empty()) io::check_output_dir("--output_dir", o.output_dir);
  context.layout = {o.train_batch_size, accumulation_for(o, context.comm->world_size()), context.comm->world_size()};
  // Every rank must use the same seed: rank 0 draws one when none is given.
  at::Tensor seed = at::tensor(static_cast<int64_t>(o.seed.value_or(std::random_device{}() & 0x7fffffff)), at::kLong);
  context.comm->broadcast(seed, 0);
  context.seed = static_cast<uint64_t>(seed.item<int64_t>());
  context.precision = PrecisionPolicy::from_flag(o.mixed_precision);
  return context;
}

Trainer::Trainer(const TrainerOptions& options, RunContext& context, Task& task)
    : options_(options), context_(context), task_(task), output_dir_(options.output_dir) {
  const data::BatchLayout& layout = context_.layout;
  state_.seed = context_.seed;
  state_.global_batch = layout.global();
  state_.dataset_size = task_.dataset_size();
  steps_per_epoch_ = data::steps_per_epoch(task_.dataset_size(), layout);
  if (task_.dataset_size() > 0 && task_.dataset_size() < layout.global() && context_.comm->rank() == 0)
    log::warn("the dataset has {} samples, fewer than one global batch of {}: every step repeats them",
              task_.dataset_size(), layout.global());
  const std::optional<int64_t> steps = options_.max_train_steps ? options_.max_train_steps : task_.default_max_steps();
  SD_CHECK(steps || steps_per_epoch_ > 0, "--max_train_steps is required: this data has no epochs to count");
  max_steps_ = steps.value_or(options_.num_train_epochs * steps_per_epoch_);
  SD_CHECK(max_steps_ >= 1, "--max_train_steps must be at least 1, got {}", max_steps_);

  base_lr_ = options_.learning_rate * (options_.scale_lr ? static_cast<double>(layout.global()) : 1.0);
  schedule_ = {options_.lr_scheduler, options_.lr_warmup_steps, max_steps_, options_.lr_num_cycles};
  schedule_.polynomial_power = options_.lr_power;
  train::validate(schedule_);
  SD_CHECK(options_.learning_rate >= 0 && std::isfinite(options_.learning_rate),
           "--learning_rate must be a finite number >= 0, got {}", options_.learning_rate);
  SD_CHECK(!options_.max_grad_norm || *options_.max_grad_norm > 0, "--max_grad_norm must be positive, got {}",
           options_.max_grad_norm.value_or(0));
  SD_CHECK(options_.checkpointing_steps >= 1, "--checkpointing_steps must be at least 1, got {}",
           options_.checkpointing_steps);

  TrainableOptions trainable;
  trainable.precision = context_.precision;
  trainable.sharding = parse_sharding(options_.sharding);
  trainable.adam = options_.adam;
  SD_CHECK(options_.bucket_cap_mb > 0, "--bucket_cap_mb must be positive, got {}", options_.bucket_cap_mb);
  trainable.bucket_cap_bytes = static_cast<int64_t>(options_.bucket_cap_mb * (1 << 20));
  if (options_.use_ema) trainable.ema = options_.ema;
  params_ = std::make_unique<TrainableParameters>(task_.trainable_parameters(), trainable, context_.comm);

  if (!options_.measure_only) resume_and_open_outputs();
  check_ranks_agree(*context_.comm, run_settings(), "the run");
  log::info(
      "{} rank(s) x batch {} x accumulation {} = global batch {}; {} steps from step {}, lr {:g}, seed {}, "
      "{} thread(s) per rank, {} trained parameters ({}{})",
      layout.world, layout.batch, layout.accumulation, layout.global(), max_steps_, state_.step, base_lr_, state_.seed,
      at::get_num_threads(), params_->numel(), sharding_name(trainable.sharding),
      context_.precision.mixed() ? ", bf16 compute" : "");
}

Trainer::~Trainer() = default;

json Trainer::run_settings() const {
  // Every flag's value, given or default: a rank told --sharding no_shard agrees with one that was not told.
  json settings = json::object();
  for (const char* given_or_default : {"defaults", "flags"}) {
    const json flags = options_.run_info.value(given_or_default, json::object());  // items() refers into it
    for (const auto& [flag, value] : flags.items()) settings["--" + flag] = value;
  }
  // Chosen per machine, not per run.
  for (const char* per_machine : {"--threads", "--dist_iface", "--dist_timeout", "--dist_transport", "--local_rank"})
    settings.erase(per_machine);
  settings["command"] = options_.run_info.value("command", "");
  settings["dataset size"] = task_.dataset_size();
  settings["data listing"] = task_.data_fingerprint();
  settings["trained numbers"] = params_->numel();
  settings["resume step"] = state_.step;
  return settings;
}

void Trainer::resume_and_open_outputs() {
  if (is_main()) {
    // Before anything in the folder is touched: recovery would take a running run's partial checkpoint for debris.
    fs::create_directories(output_dir_);
    output_lock_.emplace("--output_dir", output_dir_);
    recover_interrupted_outputs();
  }
  check_every_rank_sees_the_output_dir();
  if (auto checkpoint = resolve_checkpoint(output_dir_, options_.resume_from_checkpoint)) {
    resume_from(*checkpoint);
  } else if (!options_.resume_from_checkpoint.empty()) {
    log::info("no checkpoint in {} to resume from; starting a new training run", output_dir_.string());
  }
  if (!is_main()) return;
  metrics_ = MetricsSink(output_dir_ / options_.logging_dir, options_.report_to, state_.step);
  json run = options_.run_info;
  run["world_size"] = context_.layout.world;
  io::write_text_file(output_dir_ / options_.logging_dir / "run.json", run.dump(2) + "\n");
}

// Sharded checkpoints are written by every rank into one folder, so ranks that write to folders of their own (an
// --output_dir on local disks, a Kubernetes volume that is not ReadWriteMany) would leave checkpoints that look whole
// to rank 0 and miss the other ranks' pieces. Rank 0 puts a file there and every rank looks for it.
void Trainer::check_every_rank_sees_the_output_dir() {
  dist::Communicator& comm = *context_.comm;
  if (comm.world_size() == 1) {
    comm.barrier();
    return;
  }
  const int64_t rank0_pid = comm.all_gather({static_cast<int64_t>(getpid())}).at(0);
  // Named like a temporary file of rank 0's process, so that the start-up recovery removes it if this run dies here.
  const fs::path probe = output_dir_ / fmt::format(".sdtrain-rank0-probe.tmp{}", rank0_pid);
  if (is_main()) io::write_text_file(probe, "");
  comm.barrier();
  const std::vector<int64_t> sees = comm.all_gather({is_main() || fs::exists(probe) ? 1 : 0});
  comm.barrier();
  if (is_main()) fs::remove(probe);
  std::vector<int> blind;
  for (int r = 0; r < comm.world_size(); ++r)
    if (!sees[r]) blind.push_back(r);
  if (blind.empty()) return;
  const std::string who = fmt::format("--output_dir {}: rank(s) {} do not see the files rank 0 writes there",
                                      output_dir_.string(), fmt::join(blind, ", "));
  SD_CHECK(parse_sharding(options_.sharding) == Sharding::kNoShard,
           "{}; sharded checkpoints are written by every rank into one folder, so every machine must mount the "
           "same shared storage there (a network file system, a ReadWriteMany volume)",
           who);
  if (is_main())
    log::warn("{}: checkpoints are written by rank 0 alone, but to resume, every machine must see them (copy them)",
              who);
}

// What a killed run left in the output folder: a checkpoint-N or pipeline folder caught between its old and new
// version (restored or finished), temporary files and folders of dead processes, unfinished checkpoints.
void Trainer::recover_interrupted_outputs() {
  io::recover_interrupted_writes(output_dir_, [](const std::string& name) {
    return is_checkpoint_name(name) || pipeline::is_component_folder(name);
  });
  for (const fs::path& sub : {fs::path(options_.logging_dir), fs::path("validation")})
    io::recover_interrupted_writes(output_dir_ / sub, [](const std::string&) { return false; });
  discard_partial_checkpoints(output_dir_);
}

StepReport Trainer::train_step() {
  const data::BatchLayout& layout = context_.layout;
  double loss_sum = 0;
  for (int64_t micro = 0; micro < layout.accumulation; ++micro) {
    const at::Tensor loss = task_.micro_batch_loss(state_.data_step(), micro);
    loss_sum += loss.item<double>();
    params_->backward(loss, micro == 0, micro + 1 == layout.accumulation);
  }
  StepReport report;
  report.step = state_.step + 1;
  report.grad_norm = params_->reduce_gradients(layout.accumulation, options_.max_grad_norm);
  std::vector<at::Tensor> loss{at::tensor(loss_sum / static_cast<double>(layout.accumulation), at::kDouble)};
  {
    SD_PERF_SCOPE("sdtrain::communication");
    context_.comm->allreduce_mean(loss);
  }
  report.loss = loss[0].item<double>();
  report.lr = base_lr_ * lr_multiplier(schedule_, state_.step, base_lr_);
  // Every rank sees the same global loss and norm, so all of them take the same branch.
  if (std::isfinite(report.loss) && std::isfinite(report.grad_norm)) {
    params_->step(report.lr);
  } else {
    skip_nonfinite_step(report);
  }
  report.ema_decay = params_->last_ema_decay();
  state_.step += 1;
  state_.samples_seen += layout.global();
  return report;
}

void Trainer::skip_nonfinite_step(const StepReport& report) {
  params_->discard_gradients();
  state_.nonfinite_steps_skipped += 1;
  SD_CHECK(state_.nonfinite_steps_skipped <= options_.skip_nonfinite_steps,
           "step {}: the loss is {} and the gradient norm {}, not finite numbers; training stopped (the last "
           "checkpoint is kept). Lower --learning_rate, or let --skip_nonfinite_steps N drop such steps",
           report.step, report.loss, report.grad_norm);
  log::warn("step {}: the loss is {} and the gradient norm {}; the update is skipped ({} of {} allowed)", report.step,
            report.loss, report.grad_norm, state_.nonfinite_steps_skipped, options_.skip_nonfinite_steps);
}

void Trainer::record(const StepReport& r, double seconds) {
  json line = {{"step", r.step},
               {"loss", r.loss},
               {"lr", r.lr},
               {"grad_norm", r.grad_norm},
               {"step_time_s", seconds},
               {"images_per_s", static_cast<double>(context_.layout.global() * task_.images_per_sample()) / seconds}};
  if (steps_per_epoch_ > 0) line["epoch"] = (state_.data_step() - 1) / steps_per_epoch_;
  if (params_->has_ema()) line["ema_decay"] = r.ema_decay;
  line.update(task_.step_metrics());
  metrics_.log_step(line);
}

int Trainer::run() {
  ProgressBar bar(task_.name(), max_steps_, state_.step);
  if (!is_main()) bar.finish();
  while (state_.step < max_steps_) {
    if (options_.before_each_step) options_.before_each_step(state_.step);
    const auto started = std::chrono::steady_clock::now();
    const StepReport report = train_step();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (options_.after_each_step) options_.after_each_step(report, seconds);
    if (options_.measure_only) continue;
    task_.after_step(report);
    const bool stopping = dist::any_rank_stopping(*context_.comm);
    if (is_main()) {
      record(report, seconds);
      bar.update(report.step, fmt::format("loss {:.4f} lr {:.2e}", report.loss, report.lr));
      task_.periodic_outputs(report.step);
    }
    if (report.step % options_.checkpointing_steps == 0 || stopping) save_checkpoint();
    if (stopping) {
      bar.finish();
      log::info("stopped at step {}: checkpoint-{} written; resume with --resume_from_checkpoint latest", report.step,
                report.step);
      return stop_exit_code();
    }
    if (task_.wants_validation(report.step, report.step == max_steps_)) validate(report);
  }
  bar.finish();
  if (options_.measure_only) return 0;
  const fs::path result = export_final();
  context_.comm->barrier();
  if (is_main()) std::printf("%s\n", result.c_str());
  return 0;
}

void Trainer::validate(const StepReport& report) {
  // As diffusers' scripts: validation images come from the EMA weights when there are some.
  std::unique_ptr<TrainableParameters::ComputeSwap> ema;
  if (params_->has_ema()) ema = params_->swap_in_ema();
  if (is_main()) save_validation_images(report.step, task_.validation_images(report.step));
  context_.comm->barrier();
}

void Trainer::save_validation_images(int64_t step, const at::Tensor& images) {
  std::vector<io::RgbImage> rgb;
  for (int64_t i = 0; i < images.size(0); ++i) {
    rgb.push_back(pipeline::to_rgb_image(images[i]));
    io::save_png(output_dir_ / "validation" / fmt::format("step-{}-{}.png", step, i), rgb.back());
  }
  metrics_.log_validation_images(step, rgb);
}

fs::path Trainer::export_final() {
  io::TensorMap weights = params_->gather(StateKind::kMaster);
  io::TensorMap ema = params_->has_ema() ? params_->gather(StateKind::kEma) : io::TensorMap{};
  return is_main() ? task_.export_final(weights, ema) : fs::path();
}

// ---------------------------------------------------------------------------------------------------------------
// Checkpoints: every rank writes its part into checkpoint-N.partial; once all have, the main rank writes
// manifest.json (which marks the checkpoint whole), renames the folder into place, and only then removes the
// checkpoints beyond --checkpoints_total_limit.

void Trainer::save_checkpoint() {
  const fs::path final_dir = output_dir_ / fmt::format("checkpoint-{}", state_.step);
  const fs::path partial = partial_checkpoint_path(final_dir);
  if (is_main()) {
    fs::remove_all(partial);
    fs::create_directories(partial);
  }
  context_.comm->barrier();
  json manifest = {{"format", kCheckpointFormat},
                   {"task", task_.name()},
                   {"identity", task_.identity()},
                   {"step", state_.step},
                   {"trained", params_->save(partial, task_.checkpoint_files())},
                   {"task_state", task_.extra_state()}};
  if (is_main()) {
    task_.write_checkpoint_extras(partial);
    io::write_text_file(partial / "training_state.json", state_.to_json().dump(2) + "\n");
  }
  context_.comm->barrier();
  if (!is_main()) return;
  // Whole or absent: a piece that did not arrive (storage that lost a rank's writes) must not be published.
  std::set<std::string> shard_files;
  for (const json& piece : manifest["trained"].value("pieces", json::array()))
    shard_files.insert(piece.at("file").get<std::string>());
  for (const std::string& file : shard_files)
    SD_CHECK(fs::exists(partial / file),
             "{}: {} is missing after every rank wrote its part; is --output_dir the same shared storage on every "
             "machine?",
             partial.string(), file);
  io::write_text_file(partial / kManifestName, manifest.dump(1) + "\n");
  publish_checkpoint(partial, final_dir);
  remove_old_checkpoints(output_dir_, options_.checkpoints_total_limit);
}

void Trainer::resume_from(const fs::path& dir) {
  try {
    resume_from_manifest(dir, read_manifest(dir));
  } catch (const json::exception& e) {
    fail("{}: malformed checkpoint ({})", (dir / kManifestName).string(), e.what());
  }
  log::info("resuming from {} (step {})", dir.string(), state_.step);
}

// The data step, in this run's layout, at the point of the epoch a checkpoint of another global batch had reached:
// the same epoch, past as many samples (rounded up to whole steps), so no sample is trained twice or skipped.
int64_t Trainer::continue_epoch_with_new_batch(const TrainingState& stored) const {
  if (steps_per_epoch_ == 0) return stored.step;
  const int64_t old_steps_per_epoch =
      data::steps_per_epoch(task_.dataset_size(), data::BatchLayout{stored.global_batch, 1, 1});
  const int64_t epoch = stored.data_step() / old_steps_per_epoch;
  const int64_t samples_into_epoch =
      std::min(task_.dataset_size(), (stored.data_step() % old_steps_per_epoch) * stored.global_batch);
  const int64_t global = context_.layout.global();
  return epoch * steps_per_epoch_ + (samples_into_epoch + global - 1) / global;
}

void Trainer::resume_from_manifest(const fs::path& dir, const json& manifest) {
  SD_CHECK(manifest.at("task") == task_.name(), "{}: a {} checkpoint cannot resume a {} run", dir.string(),
           manifest.at("task").get<std::string>(), task_.name());
  // Every setting that differs, so a changed --lora_rank is not reported as the --lora_alpha it implies.
  std::vector<std::string> trained, asked;
  const json identity = task_.identity();  // items() refers into it
  for (const auto& [key, value] : identity.items()) {
    const json stored = manifest.at("identity").value(key, json());
    if (stored == value) continue;
    trained.push_back(fmt::format("--{} {}", key, stored.dump()));
    asked.push_back(fmt::format("--{} {}", key, value.dump()));
  }
  SD_CHECK(trained.empty(), "{}: the checkpoint was trained with {}; this run has {}", dir.string(),
           fmt::join(trained, " and "), fmt::join(asked, " and "));
  const TrainingState stored = TrainingState::from_json(io::JsonConfig::load(dir / "training_state.json").raw(),
                                                        (dir / "training_state.json").string());
  if (stored.global_batch != state_.global_batch) {
    const int64_t continued = continue_epoch_with_new_batch(stored);
    state_.data_step_offset = continued - stored.step;
    log::warn(
        "{}: the global batch changes from {} to {}; training continues in epoch {} after the samples the checkpoint "
        "saw of it, in another order than the original run",
        dir.string(), stored.global_batch, state_.global_batch,
        steps_per_epoch_ > 0 ? continued / steps_per_epoch_ : 0);
  } else {
    state_.data_step_offset = stored.data_step_offset;
  }
  if (stored.dataset_size > 0 && stored.dataset_size != state_.dataset_size)
    log::warn(
        "{}: the checkpoint was trained on {} samples per epoch, this data has {}; the data order will differ "
        "from the original run",
        dir.string(), stored.dataset_size, state_.dataset_size);
  if (options_.seed && *options_.seed != stored.seed)
    log::warn("{}: --seed {} is ignored: a resumed run continues the checkpoint's random draws (seed {})", dir.string(),
              *options_.seed, stored.seed);
  if (stored.step >= max_steps_)
    log::warn("{}: the checkpoint is at step {}, --max_train_steps is {}: nothing is left to train", dir.string(),
              stored.step, max_steps_);
  state_.step = stored.step;
  state_.seed = context_.seed = stored.seed;  // tasks draw their randomness from the context's seed
  state_.samples_seen = stored.samples_seen;
  state_.nonfinite_steps_skipped = stored.nonfinite_steps_skipped;  // --skip_nonfinite_steps counts over the run
  params_->load(dir, manifest.at("trained"));
  // Every finished step took one optimizer step except the ones whose update was dropped: anything else means the
  // checkpoint's files do not belong together.
  SD_CHECK(params_->optimizer_steps() == stored.step - stored.nonfinite_steps_skipped,
           "{}: the optimizer state has taken {} steps, but training_state.json says step {} with {} skipped: the "
           "checkpoint is damaged",
           dir.string(), params_->optimizer_steps(), stored.step, stored.nonfinite_steps_skipped);
  task_.load_extra_state(manifest.value("task_state", json::object()));
}

}  // namespace sd::train
