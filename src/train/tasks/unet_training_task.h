// The UNet-training task (train/tasks/unet_training.h) as a class, for the tasks that vary it: LoRA training
// (train/tasks/lora_training.h) trains adapters on a frozen UNet with the same data, noise, loss and validation.
#pragma once
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/training_batches.h"
#include "data/training_data.h"
#include "models/vae/vae_config.h"
#include "pipeline/model_source.h"
#include "pipeline/stable_diffusion.h"
#include "train/tasks/denoising_loss.h"
#include "train/tasks/unet_training.h"

namespace sd::train {

class UNetTrainingTask : public Task {
 public:
  // `unet_dtype`: float32 when the UNet itself trains (its values are the master weights); a variation that keeps it
  // frozen passes the frozen-model dtype.
  UNetTrainingTask(const UNetTrainingOptions& o, RunContext& context, at::ScalarType unet_dtype = at::kFloat);

  std::string name() const override { return "unet"; }
  std::vector<NamedParameter> trainable_parameters() override;
  int64_t dataset_size() const override { return planner_->samples_per_epoch(); }
  int64_t images_per_sample() const override { return planner_->images_per_sample(); }
  // A replay runs the steps its file holds.
  std::optional<int64_t> default_max_steps() const override { return replay_steps_; }
  std::string data_fingerprint() const override { return data_fingerprint_; }
  at::Tensor micro_batch_loss(int64_t step, int64_t micro) override;

  nlohmann::json identity() const override;
  // As the script's accelerator.save_state hooks: unet/ (and text_encoder/) and unet_ema/ load in diffusers on their
  // own.
  WholeTensorFiles checkpoint_files() const override;
  void write_checkpoint_extras(const std::filesystem::path& dir) override;
  void after_step(const StepReport& report) override;
  bool wants_validation(int64_t step, bool last_step) const override;
  at::Tensor validation_images(int64_t step) override;
  std::filesystem::path export_final(const io::TensorMap& weights, const io::TensorMap& ema) override;
  nlohmann::json step_metrics() override { return {{"data_wait_s", source_->take_wait_seconds()}}; }

 protected:
  // Text embeddings of a batch's token ids, with the graph only when the text encoder trains.
  virtual at::Tensor encode_text(const at::Tensor& input_ids);
  // <output_dir>/replay.safetensors: each step's loss, lr, grad norm and EMA decay, then the final tensors.
  void write_replay_record(const io::TensorMap& weights, const io::TensorMap& ema) const;

  // What a variation reads: the options, the run, where the model came from and the models (the text encoder and
  // VAE only when the data needs encoding).
  UNetTrainingOptions o_;
  RunContext& context_;
  pipeline::ModelSource model_;
  std::filesystem::path output_dir_;
  std::unique_ptr<pipeline::StableDiffusion> pipe_;
  data::SampleCounts sample_counts_;  // the data's, as kohya counts them (for a LoRA's metadata)

 private:
  void load_models(bool with_encoders);
  // --pre_compute_text_embeddings: DreamBooth's prompts (and the validation prompts) are encoded once, one at a
  // time as the script encodes them, and the text encoder is released for the rest of the run.
  void pre_compute_text_embeddings();
  // The pre-computed rows of each prompt in a batch's token ids.
  at::Tensor precomputed_text(const at::Tensor& input_ids) const;
  data::ModelShapes model_shapes() const;
  // The VAE posterior and text embeddings of a batch of pixels and captions.
  void encode(data::TrainingBatch& batch);
  DenoisingDraws draw(const data::TrainingBatch& batch, const data::BatchRequest& request) const;
  nlohmann::json ema_config() const;
  nlohmann::json text_encoder_config() const;
  // Rewrites the exported scheduler config's prediction_type when training used another one.
  void write_trained_prediction_type(const std::filesystem::path& scheduler_config) const;

  at::ScalarType unet_dtype_;
  models::VaeConfig vae_config_;  // read even when the VAE is not loaded: latents are scaled by its factor
  std::unique_ptr<data::BatchPlanner> planner_;
  std::unique_ptr<data::BatchSource> source_;
  std::unique_ptr<DenoisingLoss> loss_;
  int64_t steps_per_epoch_ = 0;
  std::optional<int64_t> replay_steps_;
  std::string data_fingerprint_;
  io::TensorMap replay_record_;  // per step: loss, lr, grad_norm, ema_decay (with --replay_inputs)
  std::map<std::vector<int64_t>, at::Tensor> precomputed_rows_;  // token ids -> [1, L, D] text rows
  at::Tensor validation_embeds_, validation_negative_embeds_;    // [P, L, D] when pre-computed
};

}  // namespace sd::train
