// What a training task supplies to the one training loop (train/trainer.h): its trainable tensors, the loss of a
// micro-batch, and what it writes. Textual inversion, UNet training and LoRA are tasks; everything they share
// (accumulation, gradient reduction or sharding, the lr schedule, clipping, EMA, checkpoints, resume, metrics,
// stopping) lives in the trainer.
#pragma once
#include <ATen/ATen.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "train/precision.h"
#include "train/trainable_parameters.h"

namespace sd::train {

// What the trainer has to tell a task after a step (e.g. for its own records).
struct StepReport {
  int64_t step = 0;  // optimizer steps done, from 1
  double loss = 0;   // mean over the global batch
  double lr = 0;
  double grad_norm = 0;  // before clipping
  double ema_decay = 0;
};

class Task {
 public:
  virtual ~Task() = default;

  // "textual-inversion", "unet", ...: progress bar label and checkpoint identity.
  virtual std::string name() const = 0;
  // Every tensor the optimizer trains (float32 starting values), in a fixed order: best the order forward uses them,
  // since gradient buckets are filled in reverse (a bucket whose gradients arrive early waits for earlier buckets).
  virtual std::vector<NamedParameter> trainable_parameters() = 0;
  // Samples in one epoch (0 when the data has no epochs, e.g. a replayed run): sets the step count from
  // --num_train_epochs.
  virtual int64_t dataset_size() const = 0;
  // Images one sample of the layout trains (2 for DreamBooth's pairs of an instance and a class image): throughput
  // counts images.
  virtual int64_t images_per_sample() const { return 1; }
  // A digest of the data listing (data/listing_fingerprint.h), compared across ranks at start-up; empty when the
  // task reads nothing it could list.
  virtual std::string data_fingerprint() const { return ""; }
  // Steps when --max_train_steps is not given and the data has no epochs (e.g. the steps a replay file holds).
  virtual std::optional<int64_t> default_max_steps() const { return std::nullopt; }
  // The mean loss (float32 scalar, attached to the graph) over this rank's samples of micro-batch `micro` of
  // optimizer step `step` (both from 0). The task picks the samples with a data::BatchPlanner over the run's layout.
  virtual at::Tensor micro_batch_loss(int64_t step, int64_t micro) = 0;

  // What a checkpoint must match to resume this run (e.g. the placeholder token), compared key by key.
  virtual nlohmann::json identity() const = 0;
  // Where whole tensors go in a checkpoint written by one rank.
  virtual WholeTensorFiles checkpoint_files() const { return {}; }
  // Main rank: files a checkpoint holds besides the trained state (configs, ...).
  virtual void write_checkpoint_extras(const std::filesystem::path& dir) {}
  // State of the task itself (e.g. a data stream's position), saved in checkpoints and handed back on resume.
  virtual nlohmann::json extra_state() const { return nlohmann::json::object(); }
  virtual void load_extra_state(const nlohmann::json& state) {}

  // Every rank, after every optimizer step.
  virtual void after_step(const StepReport& report) {}
  // Main rank, after every step: the task's own periodic outputs (e.g. learned_embeds-steps-N).
  virtual void periodic_outputs(int64_t step) {}
  // Main rank: whether to validate after `step`, and the validation images ([N, H, W, 3] uint8; the model holds the
  // weights to validate). The trainer saves them as validation/step-N-i.png and logs them.
  virtual bool wants_validation(int64_t step, bool last_step) const { return false; }
  virtual at::Tensor validation_images(int64_t step) { return {}; }
  // Main rank, once training is done: the final outputs from whole float32 tensors by name (`ema`: empty without
  // an EMA). Returns the path to announce on stdout.
  virtual std::filesystem::path export_final(const io::TensorMap& weights, const io::TensorMap& ema) = 0;
  // Extra numbers for this step's metrics line (e.g. data-wait seconds); called once per step on the main rank.
  virtual nlohmann::json step_metrics() { return nlohmann::json::object(); }
};

}  // namespace sd::train
