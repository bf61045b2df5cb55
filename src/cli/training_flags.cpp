#include "cli/training_flags.h"

#include <chrono>
#include <ctime>

#include <fmt/format.h>

#include "cli/flags.h"
#include "train/metrics_sink.h"

namespace sd::cli {

void add_trainer_flags(CLI::App* cmd, train::TrainerOptions& o) {
  const std::string batch = "Batching and steps";
  flag(cmd, "--train_batch_size", o.train_batch_size, "Images per rank per micro-batch")
      ->check(in_range(1, 65536))
      ->group(batch);
  auto* accumulation =
      flag(cmd, "--gradient_accumulation_steps", o.gradient_accumulation_steps, "Micro-batches per optimizer step")
          ->check(in_range(1, 65536))
          ->group(batch);
  flag(cmd, "--global_batch_size", o.global_batch_size,
       "Images per optimizer step over all ranks; sets the accumulation to global / (ranks x --train_batch_size)")
      ->check(in_range(1, int64_t{1} << 24))
      ->excludes(accumulation)
      ->group(batch);
  flag(cmd, "--num_train_epochs", o.num_train_epochs, "Epochs, used when --max_train_steps is not given")
      ->check(at_least(1))
      ->group(batch);
  const std::string steps_default = o.max_train_steps ? fmt::format(" (default {})", *o.max_train_steps) : "";
  flag(cmd, "--max_train_steps", o.max_train_steps,
       "Optimizer steps" + steps_default + "; overrides --num_train_epochs")
      ->check(at_least(1))
      ->group(batch);

  const std::string optimizer = "Optimizer (AdamW) and learning rate";
  flag(cmd, "--learning_rate", o.learning_rate, "Learning rate after warm-up")->group(optimizer);
  switch_flag(cmd, "--scale_lr", o.scale_lr,
              "Multiply the learning rate by accumulation steps x batch size x number of ranks")
      ->group(optimizer);
  flag(cmd, "--lr_scheduler", o.lr_scheduler, "Learning-rate schedule")
      ->check(
          CLI::IsMember({"linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"}))
      ->group(optimizer);
  flag(cmd, "--lr_warmup_steps", o.lr_warmup_steps, "Linear warm-up steps of the schedule")
      ->check(at_least(0))
      ->group(optimizer);
  flag(cmd, "--lr_num_cycles", o.lr_num_cycles, "Hard restarts of cosine_with_restarts")
      ->check(at_least(1))
      ->group(optimizer);
  flag(cmd, "--lr_power", o.lr_power, "Power of the polynomial schedule")->check(finite_number())->group(optimizer);
  flag(cmd, "--adam_beta1", o.adam.beta1, "AdamW beta1")->check(finite_number())->group(optimizer);
  flag(cmd, "--adam_beta2", o.adam.beta2, "AdamW beta2")->check(finite_number())->group(optimizer);
  flag(cmd, "--adam_weight_decay", o.adam.weight_decay, "AdamW decoupled weight decay")
      ->check(finite_number())
      ->group(optimizer);
  flag(cmd, "--adam_epsilon", o.adam.eps, "AdamW epsilon")->group(optimizer);
  // The default differs by task (diffusers' train_text_to_image clips at 1.0, textual_inversion.py never does).
  // The task's default is the flag's default string, as shown in --help and compared between ranks.
  CLI::Option* clip = flag(cmd, "--max_grad_norm", o.max_grad_norm,
                           o.max_grad_norm ? "Clip the global gradient norm to this"
                                           : "Clip the global gradient norm to this (default: no clipping)");
  if (o.max_grad_norm) clip->default_str(fmt::format("{}", *o.max_grad_norm));
  clip->group(optimizer);
  flag(cmd, "--skip_nonfinite_steps", o.skip_nonfinite_steps,
       "Steps with a NaN/Inf loss or gradient skip their update, up to this many in a run; one more stops training "
       "(default 0: the first stops it)")
      ->check(at_least(0))
      ->group(optimizer);

  const std::string ema = "EMA of the weights (diffusers' EMAModel)";
  switch_flag(cmd, "--use_ema", o.use_ema, "Keep an exponential moving average of the trained weights")->group(ema);
  flag(cmd, "--ema_decay", o.ema.decay, "Upper bound of the EMA decay")->group(ema);
  flag(cmd, "--ema_min_decay", o.ema.min_decay, "Lower bound of the EMA decay")->group(ema);
  flag(cmd, "--ema_update_after_step", o.ema.update_after_step, "Steps before the EMA starts to average")->group(ema);
  switch_flag(cmd, "--ema_use_warmup", o.ema.use_warmup,
              "Decay 1 - (1 + step / inv_gamma)^-power instead of (1 + step) / (10 + step)")
      ->group(ema);
  flag(cmd, "--ema_inv_gamma", o.ema.inv_gamma, "EMA warm-up inverse gamma")->group(ema);
  flag(cmd, "--ema_power", o.ema.power, "EMA warm-up power")->group(ema);

  const std::string outputs = "Outputs, checkpoints and logs";
  flag(cmd, "--output_dir", o.output_dir, "Where the results, checkpoints and logs go")->group(outputs);
  flag(cmd, "--checkpointing_steps", o.checkpointing_steps, "Write a resumable checkpoint-N every N steps")
      ->check(at_least(1))
      ->group(outputs);
  flag(cmd, "--checkpoints_total_limit", o.checkpoints_total_limit, "Keep at most this many checkpoints")
      ->check(at_least(1))
      ->group(outputs);
  flag(cmd, "--resume_from_checkpoint", o.resume_from_checkpoint, "A checkpoint-N folder, or 'latest'")->group(outputs);
  flag(cmd, "--logging_dir", o.logging_dir, "Metrics folder, relative to --output_dir")->group(outputs);
  flag(cmd, "--report_to", o.report_to,
       "tensorboard: event files in --logging_dir beside metrics.jsonl (always written); jsonl: metrics.jsonl only; "
       "all: both")
      ->check([](const std::string& value) {
        train::reports_to_tensorboard(value);  // throws the one-line error for anything else
        return std::string();
      })
      ->group(outputs);

  const std::string run = "Precision, randomness and ranks";
  flag(cmd, "--mixed_precision", o.mixed_precision,
       "bf16: bfloat16 forward/backward with float32 master weights; fp16 is taken as bf16 on CPU")
      ->check(CLI::IsMember({"no", "fp16", "bf16"}))
      ->group(run);
  flag(cmd, "--seed", o.seed, "Seed for reproducible training (random if not given)")->check(seed_value())->group(run);
  flag(cmd, "--sharding", o.sharding,
       "no_shard: every rank keeps all optimizer state; shard_grad_op: each keeps its share of gradients, master "
       "weights, AdamW moments and EMA (FSDP SHARD_GRAD_OP)")
      ->check(CLI::IsMember({"no_shard", "shard_grad_op"}))
      ->group(run);
  flag(cmd, "--threads", o.threads, "Intra-op threads of this rank (default: cores / ranks on this node)")
      ->check(in_range(1, 1024))
      ->group(run);
  flag(cmd, "--dist_timeout", o.dist_timeout_s, "Seconds before a lost or hung peer ends the run")->group(run);
  flag(cmd, "--dist_iface", o.dist_iface, "Network interface for collectives (else GLOO_SOCKET_IFNAME)")->group(run);
  dist_transport_flag(cmd, o.dist_transport)->group(run);
}

void add_unet_memory_flags(CLI::App* cmd, models::UNetMemoryOptions& o, const std::string& group) {
  switch_flag(cmd, "--gradient_checkpointing", o.gradient_checkpointing,
              "Recompute UNet activations in backward to save memory")
      ->group(group);
  flag(cmd, "--gradient_checkpointing_levels", o.gradient_checkpointing_levels,
       "Recompute only the UNet blocks at the N highest resolutions, which hold most of the activations (implies "
       "--gradient_checkpointing; N = 4, SD's level count, recomputes every block)")
      ->check(in_range(1, 16))
      ->group(group);
  // diffusers' flag name, so command lines carry over; no xformers is involved.
  switch_flag(cmd, "--enable_xformers_memory_efficient_attention,--memory_efficient_attention",
              o.memory_efficient_attention,
              "Tiled attention that keeps no attention probabilities for backward: less memory at large resolutions, "
              "a slower backward")
      ->group(group);
}

CLI::Option* add_lora_format_flag(CLI::App* cmd, std::string& format, CLI::Option* lora_switch,
                                  const std::string& group) {
  return flag(cmd, "--lora_format", format,
              "diffusers: pytorch_lora_weights.safetensors only; kohya: also <output_dir name>.safetensors for "
              "A1111/kohya")
      ->check(CLI::IsMember({"diffusers", "kohya"}))
      ->needs(lora_switch)
      ->group(group);
}

void add_python_only_training_flags(CLI::App* cmd) {
  accepted_python_flag(cmd, "--push_to_hub", false, "sdtrain never uploads; copy --output_dir yourself");
  accepted_python_flag(cmd, "--hub_token", true, "sdtrain never uploads; ignored");
  accepted_python_flag(cmd, "--hub_model_id", true, "sdtrain never uploads; ignored");
  accepted_python_flag(cmd, "--allow_tf32", false, "TF32 is a CUDA setting; ignored on CPU");
  accepted_python_flag(cmd, "--local_rank", true, "ranks come from the launcher's environment");
}

void record_command_line(CLI::App* cmd, train::TrainerOptions& o) {
  nlohmann::json flags = nlohmann::json::object(), defaults = nlohmann::json::object();
  for (const CLI::Option* option : cmd->get_options()) {
    if (option->get_lnames().empty()) continue;
    const std::string& name = option->get_lnames().front();
    if (option->count() == 0) {
      // What the run used without being told: a switch is off; a flag with a value, its default (if it has one).
      if (option->get_type_size() == 0)
        defaults[name] = "false";
      else if (!option->get_default_str().empty())
        defaults[name] = option->get_default_str();
      continue;
    }
    const auto values = option->results();
    flags[name] = values.size() == 1 ? nlohmann::json(values.front()) : nlohmann::json(values);
  }
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char started[32];
  std::strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  o.run_info = {{"command", cmd->get_name()}, {"flags", flags}, {"defaults", defaults}, {"started", started}};
}

}  // namespace sd::cli
