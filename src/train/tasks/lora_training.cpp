#include "train/tasks/lora_training.h"

#include <ctime>

#include "core/error.h"
#include "core/log.h"
#include "data/random_streams.h"
#include "models/lora.h"
#include "pipeline/lora_file.h"
#include "train/tasks/unet_training_task.h"

namespace sd::train {

namespace fs = std::filesystem;
using nlohmann::json;
using pipeline::LoraComponent;

namespace {

// The text-encoder layers diffusers' LoRA scripts adapt (LoraLoaderMixin._modify_text_encoder).
const std::vector<std::string> kTextEncoderTargets = {"q_proj", "k_proj", "v_proj", "out_proj"};

// peft's rule for target_modules: a target names a layer by the last components of its path ("to_q", "to_out.0",
// "attn2.to_k").
bool matches_target(const std::string& path, const std::string& target) {
  if (path == target) return true;
  const std::string suffix = "." + target;
  return path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Python's str() of a bool and of a float, as kohya's metadata holds them.
std::string py_bool(bool value) { return value ? "True" : "False"; }
std::string py_float(double value) {
  std::string s = fmt::format("{}", value);  // the shortest round-trip form, as Python's repr
  return s.find_first_of(".en") == std::string::npos ? s + ".0" : s;
}

// "runs/cat-lora/" -> "cat-lora"; a Hub name "runwayml/stable-diffusion-v1-5" -> "stable-diffusion-v1-5" (as kohya's
// basename of the model argument)
std::string folder_name(const fs::path& dir) {
  fs::path p = fs::absolute(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

class LoraTrainingTask : public UNetTrainingTask {
 public:
  LoraTrainingTask(const LoraTrainingOptions& o, RunContext& context);

  std::string name() const override { return "lora"; }
  std::vector<NamedParameter> trainable_parameters() override;
  json identity() const override;
  // A checkpoint's adapters under diffusers' names: its pytorch_lora_weights.safetensors loads in diffusers (exactly
  // the exported file when alpha = rank).
  WholeTensorFiles checkpoint_files() const override {
    WholeTensorFiles files;
    files.master_file = "pytorch_lora_weights.safetensors";
    files.ema_file = "pytorch_lora_weights_ema.safetensors";
    return files;
  }
  void write_checkpoint_extras(const fs::path& dir) override {}
  void after_step(const StepReport& report) override;
  fs::path export_final(const io::TensorMap& weights, const io::TensorMap& ema) override;

 protected:
  at::Tensor encode_text(const at::Tensor& input_ids) override;

 private:
  // Adapters (down ~ N(0, 1/rank²), up = 0) on every layer of `component` matching one of `targets`; each target
  // must match some layer.
  void add_adapters(LoraComponent component, const std::vector<std::string>& targets, const std::string& flag);
  // The adapted layers with the trained tensors of `weights` (by parameter name).
  pipeline::LoraWeights trained(const io::TensorMap& weights) const;
  std::map<std::string, std::string> kohya_metadata() const;

  LoraTrainingOptions lora_;
  double alpha_;
  std::vector<pipeline::LoraModule> modules_;  // down and up are the trained tensors, in training order
  std::time_t started_ = std::time(nullptr);
  int64_t last_step_ = 0;
};

LoraTrainingTask::LoraTrainingTask(const LoraTrainingOptions& o, RunContext& context)
    : UNetTrainingTask(o, context, context.precision.frozen),
      lora_(o),
      alpha_(o.lora_alpha.value_or(static_cast<double>(o.lora_rank))) {
  SD_CHECK(o.lora_rank > 0, "--lora_rank must be positive, got {}", o.lora_rank);
  SD_CHECK(alpha_ > 0, "--lora_alpha must be positive, got {}", alpha_);
  SD_CHECK(!o.lora_target_modules.empty(), "--lora_target_modules: give at least one layer name");
  pipeline::parse_lora_format(o.lora_format);  // a bad name fails now, not after training
  SD_CHECK(!o.train_text_encoder_lora || !pipe_->text_encoder.is_empty(),
           "--train_text_encoder_lora needs the text encoder, which --train_latents, --synthetic_data latents and "
           "--replay_inputs run without");
  for (auto& p : pipe_->unet->parameters()) p.set_requires_grad(false);
  add_adapters(LoraComponent::kUNet, o.lora_target_modules, "--lora_target_modules");
  if (o.train_text_encoder_lora) add_adapters(LoraComponent::kTextEncoder, kTextEncoderTargets, "text encoder");
  int64_t numel = 0;
  for (const auto& m : modules_) numel += m.down.numel() + m.up.numel();
  log::info("LoRA rank {} alpha {} on {} layers: {} trained parameters", o.lora_rank, alpha_, modules_.size(), numel);
}

void LoraTrainingTask::add_adapters(LoraComponent component, const std::vector<std::string>& targets,
                                    const std::string& flag) {
  torch::nn::Module& model = component == LoraComponent::kUNet ? static_cast<torch::nn::Module&>(*pipe_->unet)
                                                               : static_cast<torch::nn::Module&>(*pipe_->text_encoder);
  std::set<std::string> unmatched(targets.begin(), targets.end());
  const double rank = static_cast<double>(lora_.lora_rank);
  for (const auto& [path, host] : models::lora_hosts(model)) {
    bool adapt = false;
    for (const std::string& target : targets) {
      if (!matches_target(path, target)) continue;
      adapt = true;
      unmatched.erase(target);
    }
    if (!adapt) continue;
    const auto [down_shape, up_shape] = models::lora_adapter_shapes(host->base_weight_shape(), lora_.lora_rank);
    at::Generator gen = data::stream_generator(context_.seed, data::Stream::kLoraInit, modules_.size());
    at::Tensor down = (at::randn(down_shape, gen) * (1.0 / rank)).requires_grad_(true);
    at::Tensor up = at::zeros(up_shape).requires_grad_(true);
    host->add_adapter({down, up, alpha_, 1.0}, path);
    modules_.push_back({component, path, down, up, alpha_});
  }
  SD_CHECK(unmatched.empty(), "{}: '{}' matches no Linear or Conv2d layer of the {}", flag, *unmatched.begin(),
           component == LoraComponent::kUNet ? "UNet" : "text encoder");
}

std::vector<NamedParameter> LoraTrainingTask::trainable_parameters() {
  std::vector<NamedParameter> params;
  for (const auto& m : modules_) {
    params.push_back({pipeline::diffusers_lora_key(m.component, m.module, "down"), m.down});
    params.push_back({pipeline::diffusers_lora_key(m.component, m.module, "up"), m.up});
  }
  return params;
}

json LoraTrainingTask::identity() const {
  json id = UNetTrainingTask::identity();
  id.update({{"lora_rank", lora_.lora_rank},
             {"lora_alpha", alpha_},
             {"lora_target_modules", lora_.lora_target_modules},
             {"train_text_encoder_lora", lora_.train_text_encoder_lora}});
  return id;
}

at::Tensor LoraTrainingTask::encode_text(const at::Tensor& input_ids) {
  if (!lora_.train_text_encoder_lora) return UNetTrainingTask::encode_text(input_ids);
  return pipe_->text_encoder->forward(input_ids).last_hidden_state;  // with the graph, for the adapters' gradients
}

void LoraTrainingTask::after_step(const StepReport& report) {
  UNetTrainingTask::after_step(report);
  last_step_ = report.step;
}

pipeline::LoraWeights LoraTrainingTask::trained(const io::TensorMap& weights) const {
  pipeline::LoraWeights out = modules_;
  for (pipeline::LoraModule& m : out) {
    m.down = weights.at(pipeline::diffusers_lora_key(m.component, m.module, "down"));
    m.up = weights.at(pipeline::diffusers_lora_key(m.component, m.module, "up"));
  }
  return out;
}

// What kohya's train_network.py records about a run (the ss_* keys sdtrain has a value for), all as strings the way
// Python's str() writes them; A1111 and its extensions show these.
std::map<std::string, std::string> LoraTrainingTask::kohya_metadata() const {
  const TrainerOptions& t = o_.training;
  // SD-2 UNets project with Linear layers in their transformers, SD-1 ones with 1x1 convolutions.
  const bool v2 = pipe_->unet->config().use_linear_projection;
  const bool v_prediction = identity().at("prediction_type") == "v_prediction";
  std::map<std::string, std::string> m = {
      {"ss_network_module", "networks.lora"},
      {"ss_network_dim", std::to_string(lora_.lora_rank)},
      {"ss_network_alpha", py_float(alpha_)},
      {"ss_base_model_version", std::string(v2 ? "sd_v2" : "sd_v1") + (v_prediction ? "_v" : "")},
      {"ss_v2", py_bool(v2)},
      {"ss_sd_model_name", folder_name(o_.model.name_or_path)},
      {"ss_training_started_at", std::to_string(started_)},
      {"ss_training_finished_at", std::to_string(std::time(nullptr))},
      {"ss_steps", std::to_string(last_step_)},
      {"ss_max_train_steps", std::to_string(last_step_)},
      {"ss_learning_rate", py_float(t.learning_rate)},
      {"ss_unet_lr", py_float(t.learning_rate)},
      {"ss_lr_scheduler", t.lr_scheduler},
      {"ss_lr_warmup_steps", std::to_string(t.lr_warmup_steps)},
      {"ss_batch_size_per_device", std::to_string(t.train_batch_size)},
      {"ss_gradient_accumulation_steps", std::to_string(t.gradient_accumulation_steps)},
      {"ss_gradient_checkpointing", py_bool(pipe_->unet->checkpointed_levels() > 0)},
      {"ss_mixed_precision", t.mixed_precision},
      {"ss_seed", std::to_string(context_.seed)},
      {"ss_resolution", fmt::format("({0}, {0})", o_.data.transform.resolution)},
      {"ss_num_train_images", std::to_string(sample_counts_.training)},
      {"ss_num_reg_images", std::to_string(sample_counts_.regularization)},
      {"ss_noise_offset", py_float(o_.noise_offset)},
      {"ss_prior_loss_weight", py_float(o_.data.prior_loss_weight)},
      {"ss_optimizer", "torch.optim.adamw.AdamW"},
      {"ss_output_name", folder_name(output_dir_)},
  };
  if (lora_.train_text_encoder_lora) m["ss_text_encoder_lr"] = py_float(t.learning_rate);
  if (o_.snr_gamma) m["ss_min_snr_gamma"] = py_float(*o_.snr_gamma);
  if (t.max_grad_norm) m["ss_max_grad_norm"] = py_float(*t.max_grad_norm);
  return m;
}

fs::path LoraTrainingTask::export_final(const io::TensorMap& weights, const io::TensorMap& ema) {
  fs::create_directories(output_dir_);
  if (!o_.data.replay_inputs.empty()) write_replay_record(weights, ema);
  // The EMA weights with --use_ema, as UNet training exports them.
  const pipeline::LoraWeights final_weights = trained(ema.empty() ? weights : ema);
  const fs::path diffusers_file = output_dir_ / "pytorch_lora_weights.safetensors";
  pipeline::save_lora_file(diffusers_file, final_weights, pipeline::LoraFormat::kDiffusers);
  if (pipeline::parse_lora_format(lora_.lora_format) == pipeline::LoraFormat::kKohya) {
    // A1111 names a LoRA after its file (<lora:NAME:0.7>): the output folder's name, as kohya's --output_name.
    const fs::path kohya_file = output_dir_ / (folder_name(output_dir_) + ".safetensors");
    pipeline::save_lora_file(kohya_file, final_weights, pipeline::LoraFormat::kKohya, kohya_metadata());
    log::info("kohya/A1111 LoRA written to {}", kohya_file.string());
  }
  return diffusers_file;
}

}  // namespace

int run_lora_training(const LoraTrainingOptions& options) { return train_task<LoraTrainingTask>(options); }

}  // namespace sd::train
