// SchedulerConfig: every key diffusers 0.24 writes into scheduler/scheduler_config.json for the schedulers we
// implement, with diffusers' defaults, plus the beta / alphas_cumprod tables every scheduler derives from it.
#pragma once
#include <ATen/ATen.h>

#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/json_config.h"

namespace sd::schedulers {

struct SchedulerConfig {
  std::string source;      // file the config came from, for error messages
  std::string class_name;  // "_class_name" ("" when absent)

  int64_t num_train_timesteps = 1000;
  // Unset when the file omits them: HeunDiscreteScheduler defaults to SD's 0.00085..0.012, the others to
  // 0.0001..0.02 (beta_range resolves them).
  std::optional<double> beta_start;
  std::optional<double> beta_end;
  std::string beta_schedule = "linear";  // linear | scaled_linear | squaredcos_cap_v2 | sigmoid (DDPM only)
  std::optional<std::vector<double>> trained_betas;
  std::string prediction_type = "epsilon";  // epsilon | v_prediction | sample
  // Keys whose default differs between classes stay unset when the file omits them; the scheduler class fills
  // in its own default (diffusers: a key present in the file wins over the class default).
  std::optional<std::string> timestep_spacing;  // leading | trailing | linspace
  std::optional<bool> clip_sample;              // DDPM/DDIM default true, Heun false
  std::optional<bool> set_alpha_to_one;         // DDIM default true, PNDM default false
  std::optional<std::string> variance_type;     // DDPM default fixed_small, DPM-Solver default null
  int64_t steps_offset = 0;
  double clip_sample_range = 1.0;
  bool skip_prk_steps = false;
  bool thresholding = false;
  double dynamic_thresholding_ratio = 0.995;
  double sample_max_value = 1.0;
  bool rescale_betas_zero_snr = false;

  // DPMSolverMultistepScheduler and UniPCMultistepScheduler
  int64_t solver_order = 2;
  std::optional<std::string> solver_type;  // DPM-Solver: midpoint | heun (default midpoint); UniPC: bh1 | bh2 (bh2)
  bool lower_order_final = true;
  // Karras et al. (2022) sigmas: DPM-Solver, UniPC, EulerDiscrete, Heun and LMS.
  bool use_karras_sigmas = false;

  // DPMSolverMultistepScheduler
  std::string algorithm_type = "dpmsolver++";  // dpmsolver | dpmsolver++ | sde-dpmsolver | sde-dpmsolver++
  bool euler_at_final = false;
  bool use_lu_lambdas = false;
  double lambda_min_clipped = -std::numeric_limits<double>::infinity();

  // EulerDiscreteScheduler
  std::string interpolation_type = "linear";  // linear | log_linear
  std::optional<double> sigma_min;
  std::optional<double> sigma_max;
  std::string timestep_type = "discrete";  // discrete | continuous

  // UniPCMultistepScheduler
  bool predict_x0 = true;
  std::vector<int64_t> disable_corrector;  // step indices whose corrector is skipped

  // Every key of the source file, so a config re-saved under another class keeps what it did not use
  // (diffusers' from_config keeps them too).
  nlohmann::json original = nlohmann::json::object();

  // Parses and validates the keys above; a bad value or type throws sd::Error naming the file and key.
  static SchedulerConfig from_json(const sd::io::JsonConfig& cfg);
  // Reads a scheduler_config.json. Python's json writes -Infinity / NaN (lambda_min_clipped), which strict JSON
  // parsers reject; they are accepted here.
  static SchedulerConfig load(const std::filesystem::path& path);

  // {beta_start, beta_end} for `class_name`: the file's values, else that class's defaults.
  std::pair<double, double> beta_range(const std::string& class_name) const;
  // solver_type as `class_name` resolves it: like diffusers, DPM-Solver reads UniPC's names (bh1, bh2) and logrho
  // as midpoint, UniPC reads DPM-Solver's (midpoint, heun) and logrho as bh2; anything else is returned as given.
  std::string resolved_solver_type(const std::string& class_name) const;

  // The keys diffusers 0.24 writes for `class_name` (resolved with that class's defaults), plus the source's
  // other keys, `_class_name` and `_diffusers_version`.
  nlohmann::json to_json(const std::string& class_name) const;

  // Throws sd::Error "<source>: key '<key>' <message>".
  [[noreturn]] void fail_key(const std::string& key, const std::string& message) const;
};

// float32 betas as diffusers builds them (torch.linspace in float32, betas_for_alpha_bar in float64 then cast).
// `class_name` names the class in errors; only DDPM knows the sigmoid schedule (`allow_sigmoid`).
at::Tensor make_betas(const SchedulerConfig& config, const std::string& class_name, bool allow_sigmoid = false);

// diffusers' rescale_zero_terminal_snr (https://arxiv.org/abs/2305.08891, Algorithm 1), in float32.
at::Tensor rescale_zero_terminal_snr(const at::Tensor& betas);

}  // namespace sd::schedulers
