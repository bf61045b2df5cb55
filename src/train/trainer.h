// The one training loop every task runs on (train/task.h). Per optimizer step:
//   for each micro-batch: loss = task.micro_batch_loss(...); backward (gradients reduced bucket by bucket)
//   mean gradient over the global batch -> global norm -> clipping -> AdamW -> EMA -> fresh compute weights
//   metrics, stop vote across ranks, checkpoint, validation
// The global batch of a step is world x accumulation x batch samples: micro-batch m of rank r takes the step's
// samples (m * world + r) * batch ... + batch - 1, so the same samples (and random draws, which are keyed by a
// sample's position) make up a step whatever the world size, and N ranks train what 1 rank with N-fold
// accumulation trains.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "data/sampler.h"
#include "dist/communicator.h"
#include "io/atomic_file.h"
#include "train/adamw.h"
#include "train/ema.h"
#include "train/lr_schedule.h"
#include "train/metrics_sink.h"
#include "train/precision.h"
#include "train/task.h"
#include "train/trainable_parameters.h"

namespace sd::train {

// Everything of the training engine a command line sets; field names are the flags' (diffusers' scripts' names).
struct TrainerOptions {
  int64_t train_batch_size = 16;
  int gradient_accumulation_steps = 1;
  std::optional<int64_t> global_batch_size;  // MosaicML-style: accumulation derived from world x batch
  int64_t num_train_epochs = 100;
  std::optional<int64_t> max_train_steps;
  double learning_rate = 1e-4;
  bool scale_lr = false;
  std::string lr_scheduler = "constant";
  int64_t lr_warmup_steps = 500;
  int lr_num_cycles = 1;
  double lr_power = 1.0;
  AdamWOptions adam;
  std::optional<double> max_grad_norm;
  int64_t skip_nonfinite_steps = 0;
  bool use_ema = false;
  EmaOptions ema;
  std::string sharding = "no_shard";
  std::optional<uint64_t> seed;
  std::string mixed_precision = "no";
  std::string output_dir;
  int64_t checkpointing_steps = 500;
  std::optional<int> checkpoints_total_limit;
  std::string resume_from_checkpoint;
  std::string logging_dir = "logs";
  std::string report_to = "tensorboard";
  std::optional<int> threads;
  double dist_timeout_s = 300;
  std::string dist_iface;
  std::string dist_transport = "auto";
  // Float32 gradients per communication bucket (PyTorch DDP's bucket_cap_mb): smaller buckets start travelling
  // earlier in backward but cost more messages.
  double bucket_cap_mb = 25;
  // The command line, kept in <logging_dir>/run.json for reports.
  nlohmann::json run_info = nlohmann::json::object();
  // For tools that measure the loop (sdtrain benchmark): called on every rank before and after each step; with
  // measure_only nothing is written (no checkpoints, metrics or final outputs).
  std::function<void(int64_t step)> before_each_step;
  std::function<void(const StepReport& report, double seconds)> after_each_step;
  bool measure_only = false;
};

// The plain state a resume needs, beside the trained tensors: everything random is a function of the seed and of
// a sample's position, so no generator state is stored.
struct TrainingState {
  int64_t step = 0;  // optimizer steps done
  uint64_t seed = 0;
  int64_t global_batch = 0;
  int64_t samples_seen = 0;
  int64_t nonfinite_steps_skipped = 0;  // steps whose update --skip_nonfinite_steps dropped
  int64_t dataset_size = 0;             // samples in an epoch (0: no dataset, or a checkpoint from before it was kept)
  // The data order's step minus the optimizer step: 0 unless a resume changed the global batch, after which the
  // data continues from the same point of the same epoch rather than from where `step` falls in the new layout.
  int64_t data_step_offset = 0;
  int64_t data_step() const { return step + data_step_offset; }
  nlohmann::json to_json() const;
  static TrainingState from_json(const nlohmann::json& j, const std::string& source);
};

// The process-wide setup a task needs before it loads its models: threads, stop signals, the communicator, the seed
// every rank shares, the batch layout and the precision policy.
struct RunContext {
  std::shared_ptr<dist::Communicator> comm;
  data::BatchLayout layout;
  uint64_t seed = 0;
  PrecisionPolicy precision;
  bool is_main() const { return comm->rank() == 0; }
};
RunContext start_run(const TrainerOptions& options);

class Trainer {
 public:
  Trainer(const TrainerOptions& options, RunContext& context, Task& task);
  ~Trainer();
  // Trains to max_train_steps (or until a stop signal: then a checkpoint is written and 128 + signal returned).
  int run();

  int64_t max_steps() const { return max_steps_; }
  const TrainingState& state() const { return state_; }
  TrainableParameters& parameters() { return *params_; }

 private:
  // Leftovers of an interrupted run removed, the checkpoint to resume from loaded, metrics and run.json opened.
  void resume_and_open_outputs();
  void recover_interrupted_outputs();
  void check_every_rank_sees_the_output_dir();
  int64_t continue_epoch_with_new_batch(const TrainingState& stored) const;
  // What must be equal on every rank: the command's flags (less the per-machine ones), the data the task found,
  // the number of trained values and the step resumed from.
  nlohmann::json run_settings() const;
  StepReport train_step();
  // A NaN/Inf loss or gradient: drops the update while --skip_nonfinite_steps allows, else stops the run.
  void skip_nonfinite_step(const StepReport& report);
  void record(const StepReport& report, double seconds);
  void save_checkpoint();
  void resume_from(const std::filesystem::path& checkpoint);
  void resume_from_manifest(const std::filesystem::path& checkpoint, const nlohmann::json& manifest);
  void validate(const StepReport& report);
  // validation/step-N-i.png, and the same images in the metrics (TensorBoard).
  void save_validation_images(int64_t step, const at::Tensor& images);
  std::filesystem::path export_final();
  bool is_main() const { return context_.is_main(); }

  TrainerOptions options_;
  RunContext& context_;
  Task& task_;
  std::filesystem::path output_dir_;
  std::unique_ptr<TrainableParameters> params_;
  TrainingState state_;
  LrSchedule schedule_;
  double base_lr_ = 0;
  int64_t max_steps_ = 0;
  int64_t steps_per_epoch_ = 0;
  std::optional<io::OutputFolderLock> output_lock_;  // main rank only
  MetricsSink metrics_;
};

// Starts the run, builds the task from `options` (whose .training are the engine's flags) and trains it; returns the
// process exit code. What every subcommand's run function does.
template <typename TaskType, typename Options>
int train_task(const Options& options) {
  RunContext context = start_run(options.training);
  TaskType task(options, context);
  Trainer trainer(options.training, context, task);
  return trainer.run();
}

}  // namespace sd::train
