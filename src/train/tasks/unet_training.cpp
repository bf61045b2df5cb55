#include "train/tasks/unet_training.h"

#include "train/tasks/unet_training_task.h"

#include <ATen/core/grad_mode.h>

#include "core/error.h"
#include "core/log.h"
#include "data/random_streams.h"
#include "io/atomic_file.h"
#include "models/weights.h"
#include "pipeline/prompt_encoding.h"
#include "pipeline/txt2img.h"
#include "schedulers/ddpm.h"
#include "schedulers/factory.h"
#include "train/tasks/class_images.h"
#include "train/tasks/denoising_loss.h"

namespace sd::train {

namespace fs = std::filesystem;
using nlohmann::json;

UNetTrainingOptions::UNetTrainingOptions() {
  training.output_dir = "sd-model-finetuned";
  training.max_grad_norm = 1.0;
}

namespace {

// The trained text encoder's parameters are named with this prefix beside the UNet's own names (which keep none,
// as checkpoints of UNet training always named them).
constexpr const char* kTextEncoderPrefix = "text_encoder.";

// Writes `config` and `weights` as a model folder, e.g. <output>/unet (weights file: diffusers' name) or
// <output>/text_encoder (transformers' name).
void write_model_folder(const fs::path& dir, const json& config, const io::TensorMap& weights,
                        const std::string& weights_file = models::WeightFileNames::diffusers().safetensors) {
  io::write_directory_atomically(dir, [&](const fs::path& tmp) {
    io::write_text_file(tmp / "config.json", config.dump(2) + "\n");
    io::save_safetensors(tmp / weights_file, weights);
  });
}

// The tensors of `all` named with `prefix`, under the rest of their names; erased from `all`.
io::TensorMap take_prefixed(io::TensorMap& all, const std::string& prefix) {
  io::TensorMap taken;
  for (auto it = all.begin(); it != all.end();) {
    if (it->first.rfind(prefix, 0) != 0) {
      ++it;
      continue;
    }
    taken[it->first.substr(prefix.size())] = std::move(it->second);
    it = all.erase(it);
  }
  return taken;
}

}  // namespace

UNetTrainingTask::UNetTrainingTask(const UNetTrainingOptions& o, RunContext& context, at::ScalarType unet_dtype)
    : o_(o),
      context_(context),
      model_(pipeline::resolve_model(o.model)),
      output_dir_(o.training.output_dir),
      unet_dtype_(unet_dtype) {
  const bool with_encoders = data::needs_encoders(data::data_kind(o.data));
  SD_CHECK(!o.train_text_encoder || with_encoders,
           "--train_text_encoder trains on captions, which --train_latents, --synthetic_data latents and "
           "--replay_inputs do not have");
  SD_CHECK(o.validation_prompts.empty() || with_encoders,
           "validation prompts (--validation_prompt, --validation_prompts) need the VAE and text encoder, which "
           "--train_latents, --synthetic_data latents and --replay_inputs run without");
  const int resolution = o.data.transform.resolution;
  SD_CHECK(resolution > 0 && resolution % 8 == 0, "--resolution {} must be a positive multiple of 8", resolution);
  // By a pipeline of their own, as the script makes them, before the training models take their memory.
  if (data::data_kind(o.data) == data::DataKind::kDreamBooth && o.data.dreambooth.with_prior_preservation)
    generate_missing_class_images(model_, o.data.dreambooth, context_.precision.frozen, context_.seed, *context_.comm);
  load_models(with_encoders);

  schedulers::DDPMScheduler ddpm(pipe_->scheduler_config);
  DenoisingLossOptions loss_options;
  loss_options.prediction_type =
      o.prediction_type.empty() ? pipe_->scheduler_config.prediction_type : o.prediction_type;
  loss_options.snr_gamma = o.snr_gamma;
  loss_options.noise_offset = o.noise_offset;
  loss_options.input_perturbation = o.input_perturbation;
  loss_options.dream_training = o.dream_training;
  loss_options.dream_detail_preservation = o.dream_detail_preservation;
  loss_ = std::make_unique<DenoisingLoss>(pipe_->unet, ddpm.alphas_cumprod(), loss_options);
  // Validation samples, and the exported scheduler describes, the target the UNet is trained for (diffusers' script
  // keeps the pretrained scheduler's, so its pipeline samples a --prediction_type v_prediction model as epsilon).
  pipe_->scheduler_config.prediction_type = loss_options.prediction_type;
  pipe_->unet->set_memory_options(o.unet_memory);

  data::TrainingData data = data::open_training_data(o.data, pipe_->tokenizer, model_shapes(), context_.seed,
                                                     context_.layout, context_.comm->rank());
  planner_ = std::move(data.planner);
  source_ = std::move(data.source);
  replay_steps_ = data.replay_steps;
  data_fingerprint_ = data.listing_fingerprint;
  sample_counts_ = data.sample_counts;
  SD_CHECK(!replay_steps_ || !o.training.max_train_steps || *o.training.max_train_steps <= *replay_steps_,
           "--max_train_steps {} exceeds the {} step(s) --replay_inputs holds", o.training.max_train_steps.value_or(0),
           replay_steps_.value_or(0));
  steps_per_epoch_ = data::steps_per_epoch(planner_->samples_per_epoch(), context_.layout);
  if (o.pre_compute_text_embeddings) pre_compute_text_embeddings();
}

void UNetTrainingTask::load_models(bool with_encoders) {
  // The UNet is loaded (or built) in unet_dtype_ (float32 when it trains: its values are the master weights), and so
  // is a text encoder that trains. The frozen VAE and text encoder are loaded only when the data needs encoding; the
  // VAE's config always is, since stored latents are scaled by its factor.
  const pipeline::PipelineConfigs configs = pipeline::read_configs(model_);
  vae_config_ = configs.vae;
  const at::ScalarType frozen = with_encoders ? context_.precision.frozen : at::ScalarType::Undefined;
  pipe_ = std::make_unique<pipeline::StableDiffusion>(
      pipeline::load_pipeline(model_, {o_.train_text_encoder ? unet_dtype_ : frozen, frozen,
                                       o_.from_scratch ? at::ScalarType::Undefined : unet_dtype_}));
  if (o_.from_scratch) {
    at::manual_seed(static_cast<int64_t>(context_.seed));
    pipe_->unet = models::UNet2DConditionModel(configs.unet);
    pipe_->unet->to(unet_dtype_);
    log::info("UNet initialised from the config of {} (seed {})", model_.path.string(), context_.seed);
  }
  pipe_->unet->train();
  if (!with_encoders) return;
  for (auto* module :
       {static_cast<torch::nn::Module*>(pipe_->text_encoder.get()), static_cast<torch::nn::Module*>(pipe_->vae.get())})
    for (auto& p : module->parameters()) p.set_requires_grad(false);
  if (o_.train_text_encoder) pipe_->text_encoder->train();
  // As the scripts' --gradient_checkpointing with a text encoder that trains (or its adapters do); a frozen one runs
  // without a graph, where checkpointing does nothing.
  pipe_->text_encoder->set_gradient_checkpointing(o_.unet_memory.gradient_checkpointing);
  SD_CHECK(o_.data.transform.resolution % pipe_->vae_scale_factor() == 0,
           "--resolution {} must be divisible by {} (the VAE's factor)", o_.data.transform.resolution,
           pipe_->vae_scale_factor());
}

void UNetTrainingTask::pre_compute_text_embeddings() {
  SD_CHECK(data::data_kind(o_.data) == data::DataKind::kDreamBooth,
           "--pre_compute_text_embeddings needs DreamBooth's fixed prompts");
  SD_CHECK(!o_.train_text_encoder, "--train_text_encoder cannot be used with --pre_compute_text_embeddings");
  const data::DreamBoothDataOptions& d = o_.data.dreambooth;
  std::vector<std::string> prompts = {d.instance_prompt};
  if (d.with_prior_preservation) prompts.push_back(d.class_prompt);
  // Keyed by the token ids the data's captions get.
  for (const std::string& prompt : prompts)
    precomputed_rows_[pipe_->tokenizer.encode(prompt)] = pipeline::encode_text(*pipe_, {prompt});
  if (!o_.validation_prompts.empty()) {
    validation_embeds_ = pipeline::encode_text(*pipe_, o_.validation_prompts);
    validation_negative_embeds_ =
        pipeline::encode_text(*pipe_, std::vector<std::string>(o_.validation_prompts.size(), ""));
  }
  pipe_->text_encoder = models::ClipTextModel(nullptr);
  log::info("--pre_compute_text_embeddings: {} prompt(s) encoded; the text encoder is released",
            prompts.size() + o_.validation_prompts.size());
}

data::ModelShapes UNetTrainingTask::model_shapes() const {
  data::ModelShapes shapes;
  shapes.latent_channels = pipe_->unet->config().in_channels;
  shapes.vae_scale_factor = vae_config_.scale_factor();
  shapes.vae_scaling_factor = vae_config_.scaling_factor;
  shapes.text_dim = pipe_->unet->config().cross_attention_dim.at(0);
  return shapes;
}

std::vector<NamedParameter> UNetTrainingTask::trainable_parameters() {
  std::vector<NamedParameter> params;
  // In forward order, so gradient buckets fill in the order backward produces them (with sharding, finished
  // buckets that must wait for an earlier one cost memory): the text encoder runs first.
  if (o_.train_text_encoder)
    for (auto& p : pipe_->text_encoder->named_parameters())
      params.push_back({kTextEncoderPrefix + p.key(), p.value().requires_grad_(true)});
  for (auto& [name, tensor] : pipe_->unet->named_parameters_in_forward_order())
    params.push_back({name, tensor.requires_grad_(true)});
  return params;
}

at::Tensor UNetTrainingTask::encode_text(const at::Tensor& input_ids) {
  if (!precomputed_rows_.empty()) return precomputed_text(input_ids);
  at::AutoGradMode graph_if_trained(o_.train_text_encoder);
  return pipe_->text_encoder->forward(input_ids).last_hidden_state;
}

at::Tensor UNetTrainingTask::precomputed_text(const at::Tensor& input_ids) const {
  const at::Tensor ids = input_ids.contiguous();
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < ids.size(0); ++i) {
    const int64_t* row = ids[i].data_ptr<int64_t>();
    const auto found = precomputed_rows_.find(std::vector<int64_t>(row, row + ids.size(1)));
    SD_CHECK(found != precomputed_rows_.end(), "a batch holds a caption the prompts pre-computed do not");
    rows.push_back(found->second);
  }
  return at::cat(rows);
}

json UNetTrainingTask::identity() const {
  json id = {{"prediction_type", loss_->options().prediction_type}};
  // Only when set, so the checkpoints of runs that never had the flag keep resuming.
  if (o_.train_text_encoder) id["train_text_encoder"] = true;
  return id;
}

WholeTensorFiles UNetTrainingTask::checkpoint_files() const {
  WholeTensorFiles files;
  files.master_file = "unet/diffusion_pytorch_model.safetensors";
  files.ema_file = "unet_ema/diffusion_pytorch_model.safetensors";
  if (o_.train_text_encoder)
    files.routes.push_back(
        {kTextEncoderPrefix, "text_encoder/model.safetensors", "text_encoder_ema/model.safetensors"});
  return files;
}

void UNetTrainingTask::encode(data::TrainingBatch& batch) {
  {
    at::NoGradGuard no_grad;
    const models::DiagonalGaussian posterior = pipe_->vae->encode(batch.pixel_values.to(context_.precision.frozen));
    batch.latent_mean = posterior.mean;
    batch.latent_std = posterior.std;
  }
  batch.encoder_hidden_states = encode_text(batch.input_ids);
}

DenoisingDraws UNetTrainingTask::draw(const data::TrainingBatch& batch, const data::BatchRequest& request) const {
  if (batch.noise.defined()) return {batch.noise, batch.timesteps, {}, {}};
  using data::Stream;
  const at::IntArrayRef shape = batch.latents.sizes().slice(1);
  const int64_t channels = shape[0];
  std::vector<at::Tensor> noise, timesteps, offset, perturbation;
  for (int64_t j = 0; j < batch.latents.size(0); ++j) {
    const data::SampleStreams gen{context_.seed, request.step, request.first_position + j};
    noise.push_back(at::randn(shape, gen(Stream::kNoise)));
    timesteps.push_back(at::randint(pipe_->scheduler_config.num_train_timesteps, {1}, gen(Stream::kTimestep)));
    if (o_.noise_offset != 0) offset.push_back(at::randn({channels, 1, 1}, gen(Stream::kNoiseOffset)));
    if (o_.input_perturbation != 0) perturbation.push_back(at::randn(shape, gen(Stream::kPerturbation)));
  }
  return {at::stack(noise), at::cat(timesteps), offset.empty() ? at::Tensor() : at::stack(offset),
          perturbation.empty() ? at::Tensor() : at::stack(perturbation)};
}

at::Tensor UNetTrainingTask::micro_batch_loss(int64_t step, int64_t micro) {
  const data::BatchRequest request = planner_->plan(step, micro);
  data::TrainingBatch batch = source_->get(request);
  if (batch.pixel_values.defined()) encode(batch);
  if (batch.latent_mean.defined())
    batch.latents =
        data::sample_posterior(batch.latent_mean, batch.latent_std, vae_config_.scaling_factor, context_.seed, request);
  return (*loss_)(batch.latents, batch.encoder_hidden_states, draw(batch, request), batch.loss_weights).loss;
}

void UNetTrainingTask::after_step(const StepReport& r) {
  if (o_.data.replay_inputs.empty()) return;
  const int64_t k = r.step - 1;
  replay_record_[fmt::format("step{}.loss", k)] = at::tensor({r.loss}, at::kDouble);
  replay_record_[fmt::format("step{}.lr", k)] = at::tensor({r.lr}, at::kDouble);
  replay_record_[fmt::format("step{}.grad_norm", k)] = at::tensor({r.grad_norm}, at::kDouble);
  replay_record_[fmt::format("step{}.ema_decay", k)] = at::tensor({r.ema_decay}, at::kDouble);
}

// diffusers' EMAModel.save_pretrained: the UNet's config plus the EMA's own settings and step.
json UNetTrainingTask::ema_config() const {
  json config = pipe_->unet->config().to_json();
  const EmaOptions& e = o_.training.ema;
  config.update({{"decay", e.decay},
                 {"min_decay", e.min_decay},
                 {"update_after_step", e.update_after_step},
                 {"use_ema_warmup", e.use_warmup},
                 {"inv_gamma", e.inv_gamma},
                 {"power", e.power}});
  return config;
}

void UNetTrainingTask::write_checkpoint_extras(const fs::path& dir) {
  io::write_text_file(dir / "unet" / "config.json", pipe_->unet->config().to_json().dump(2) + "\n");
  if (o_.training.use_ema) io::write_text_file(dir / "unet_ema" / "config.json", ema_config().dump(2) + "\n");
  if (!o_.train_text_encoder) return;
  io::write_text_file(dir / "text_encoder" / "config.json", text_encoder_config().dump(2) + "\n");
  if (o_.training.use_ema)
    io::write_text_file(dir / "text_encoder_ema" / "config.json", text_encoder_config().dump(2) + "\n");
}

// A trained text encoder is saved in float32, as its master weights are.
json UNetTrainingTask::text_encoder_config() const {
  models::ClipTextConfig config = pipe_->text_encoder->config();
  config.torch_dtype = "float32";
  return config.to_json();
}

bool UNetTrainingTask::wants_validation(int64_t step, bool last_step) const {
  // As the script: after every --validation_epochs-th epoch (counting from the first), and after the last step.
  if (o_.validation_prompts.empty() || steps_per_epoch_ == 0) return false;
  if (o_.validation_steps) return step % *o_.validation_steps == 0;
  if (last_step) return true;  // the script's final inference round with the trained pipeline
  return step % steps_per_epoch_ == 0 && ((step - 1) / steps_per_epoch_) % o_.validation_epochs == 0;
}

at::Tensor UNetTrainingTask::validation_images(int64_t step) {
  // As the scripts' validation: the pipeline's own scheduler, 20 steps (the LoRA script: 30), its default size;
  // image i uses seed + i (diffusers draws them one after another from one generator seeded with the seed).
  pipe_->unet->eval();
  auto scheduler = schedulers::make_scheduler(pipe_->scheduler_config, o_.validation_scheduler);
  pipeline::Txt2ImgOptions options;
  options.prompts = o_.validation_prompts;
  options.num_images_per_prompt = o_.num_validation_images;
  options.num_inference_steps = o_.validation_inference_steps;
  options.seed = context_.seed;
  options.prompt_embeds = validation_embeds_;
  options.negative_prompt_embeds = validation_negative_embeds_;
  const at::Tensor images =
      pipeline::txt2img_with_progress(*pipe_, *scheduler, options, fmt::format("validation at step {}", step))
          .images_uint8;
  pipe_->unet->train();
  return images;
}

void UNetTrainingTask::write_replay_record(const io::TensorMap& weights, const io::TensorMap& ema) const {
  io::TensorMap record = replay_record_;
  for (const auto& [name, t] : weights) record["final.param." + name] = t;
  for (const auto& [name, t] : ema) record["final.ema." + name] = t;
  io::save_safetensors(output_dir_ / "replay.safetensors", record);
}

void UNetTrainingTask::write_trained_prediction_type(const fs::path& scheduler_config) const {
  json config = json::parse(io::read_text_file(scheduler_config));
  const std::string trained = loss_->options().prediction_type;
  if (config.value("prediction_type", "epsilon") == trained) return;
  log::info("{}: prediction_type set to {}, the target the UNet was trained for", scheduler_config.string(), trained);
  config["prediction_type"] = trained;
  io::write_text_file(scheduler_config, config.dump(2) + "\n");
}

fs::path UNetTrainingTask::export_final(const io::TensorMap& weights, const io::TensorMap& ema) {
  fs::create_directories(output_dir_);
  if (!o_.data.replay_inputs.empty()) write_replay_record(weights, ema);
  // The trained models first (the EMA weights with --use_ema, as the script saves), then the frozen parts as they
  // are; model_index.json, written last, marks the pipeline complete.
  io::TensorMap unet = ema.empty() ? weights : ema;
  std::vector<std::string> frozen = {"vae", "tokenizer", "scheduler"};
  if (o_.train_text_encoder)
    write_model_folder(output_dir_ / "text_encoder", text_encoder_config(), take_prefixed(unet, kTextEncoderPrefix),
                       models::WeightFileNames::transformers().safetensors);
  else
    frozen.push_back("text_encoder");
  write_model_folder(output_dir_ / "unet", pipe_->unet->config().to_json(), unet);
  pipeline::copy_components(model_, output_dir_, frozen);
  write_trained_prediction_type(output_dir_ / "scheduler" / "scheduler_config.json");
  pipeline::write_model_index(output_dir_,
                              pipe_->model_index.value("scheduler", json::array({"", "PNDMScheduler"}))[1]);
  return output_dir_;
}

int run_unet_training(const UNetTrainingOptions& options) { return train_task<UNetTrainingTask>(options); }

}  // namespace sd::train
