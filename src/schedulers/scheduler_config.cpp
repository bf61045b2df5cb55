#include "schedulers/scheduler_config.h"

#include <cmath>
#include <limits>
#include <set>

#include "core/error.h"

namespace sd::schedulers {

using nlohmann::json;

namespace {

std::string join(const std::set<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string one_of(const sd::io::JsonConfig& cfg, const SchedulerConfig& c, const std::string& key,
                   const std::string& fallback, const std::set<std::string>& allowed) {
  std::string value = cfg.get<std::string>(key, fallback);
  if (!allowed.count(value)) c.fail_key(key, fmt::format("must be one of {}, got \"{}\"", join(allowed), value));
  return value;
}

// A float key that may also hold Python's -Infinity / Infinity / NaN (load() turns those into strings).
std::optional<double> special_number(const sd::io::JsonConfig& cfg, const SchedulerConfig& c, const std::string& key) {
  if (!cfg.has(key)) return std::nullopt;
  const json& v = cfg.raw()[key];
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
  }
  return cfg.get<double>(key, 0.0);  // throws the usual "must be a number" error for anything else
}

// A beta is the noise variance one step adds: a number from 0 to 1. Anything else cannot come from a real schedule
// (and beyond float32's range LibTorch would refuse to build the table).
bool is_beta(double beta) { return beta >= 0 && beta <= 1; }

std::optional<double> optional_beta(const sd::io::JsonConfig& cfg, const SchedulerConfig& c, const std::string& key) {
  const std::optional<double> beta = cfg.get_optional<double>(key);
  if (beta && !is_beta(*beta)) c.fail_key(key, fmt::format("must be a number from 0 to 1, got {}", *beta));
  return beta;
}

// diffusers' betas_for_alpha_bar with the cosine transform, in float64 like the Python original.
std::vector<double> cosine_betas(int64_t n, double max_beta = 0.999) {
  auto alpha_bar = [](double t) { return std::pow(std::cos((t + 0.008) / 1.008 * M_PI / 2), 2.0); };
  std::vector<double> betas;
  betas.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const double t1 = static_cast<double>(i) / static_cast<double>(n);
    const double t2 = static_cast<double>(i + 1) / static_cast<double>(n);
    betas.push_back(std::min(1 - alpha_bar(t2) / alpha_bar(t1), max_beta));
  }
  return betas;
}

at::Tensor float_tensor(const std::vector<double>& values) {
  return at::tensor(at::ArrayRef<double>(values), at::TensorOptions().dtype(at::kDouble)).to(at::kFloat);
}

}  // namespace

void SchedulerConfig::fail_key(const std::string& key, const std::string& message) const {
  fail("{}: key '{}' {}", source.empty() ? std::string("scheduler config") : source, key, message);
}

SchedulerConfig SchedulerConfig::from_json(const sd::io::JsonConfig& cfg) {
  SchedulerConfig c;
  c.source = cfg.source().empty() ? "scheduler config" : cfg.source();
  c.original = cfg.raw();
  c.class_name = cfg.get<std::string>("_class_name", "");

  c.num_train_timesteps = cfg.get<int64_t>("num_train_timesteps", c.num_train_timesteps);
  if (c.num_train_timesteps < 1)
    c.fail_key("num_train_timesteps", fmt::format("must be >= 1, got {}", c.num_train_timesteps));
  // 100 times SD's 1000: the schedules are tables of this length.
  io::check_at_most(c.source, "num_train_timesteps", c.num_train_timesteps, 100000);
  c.beta_start = optional_beta(cfg, c, "beta_start");
  c.beta_end = optional_beta(cfg, c, "beta_end");
  c.beta_schedule =
      one_of(cfg, c, "beta_schedule", c.beta_schedule, {"linear", "scaled_linear", "squaredcos_cap_v2", "sigmoid"});
  if (cfg.has("trained_betas")) {
    const json& v = cfg.raw()["trained_betas"];
    if (!v.is_array()) c.fail_key("trained_betas", "must be null or a list of numbers, got " + v.dump());
    std::vector<double> betas;
    for (const auto& b : v) {
      if (!b.is_number()) c.fail_key("trained_betas", "must be null or a list of numbers, got an entry " + b.dump());
      if (!is_beta(b.get<double>()))
        c.fail_key("trained_betas", "must hold numbers from 0 to 1, got an entry " + b.dump());
      betas.push_back(b.get<double>());
    }
    if (static_cast<int64_t>(betas.size()) != c.num_train_timesteps)
      c.fail_key("trained_betas",
                 fmt::format("has {} entries but num_train_timesteps is {}", betas.size(), c.num_train_timesteps));
    c.trained_betas = std::move(betas);
  }
  c.prediction_type = one_of(cfg, c, "prediction_type", c.prediction_type, {"epsilon", "v_prediction", "sample"});
  if (cfg.has("timestep_spacing"))
    c.timestep_spacing = one_of(cfg, c, "timestep_spacing", "", {"leading", "trailing", "linspace"});
  c.clip_sample = cfg.get_optional<bool>("clip_sample");
  c.set_alpha_to_one = cfg.get_optional<bool>("set_alpha_to_one");
  c.variance_type = cfg.get_optional<std::string>("variance_type");
  c.steps_offset = cfg.get<int64_t>("steps_offset", c.steps_offset);
  if (c.steps_offset < 0) c.fail_key("steps_offset", fmt::format("must be >= 0, got {}", c.steps_offset));
  c.clip_sample_range = cfg.get<double>("clip_sample_range", c.clip_sample_range);
  // The samples are clamped to it in float32: beyond, LibTorch's clamp would throw its own overflow error mid-run.
  if (!(c.clip_sample_range > 0 && c.clip_sample_range <= std::numeric_limits<float>::max()))
    c.fail_key("clip_sample_range",
               fmt::format("must be a positive number within float32's range, got {}", c.clip_sample_range));
  c.skip_prk_steps = cfg.get<bool>("skip_prk_steps", c.skip_prk_steps);
  c.thresholding = cfg.get<bool>("thresholding", c.thresholding);
  c.dynamic_thresholding_ratio = cfg.get<double>("dynamic_thresholding_ratio", c.dynamic_thresholding_ratio);
  c.sample_max_value = cfg.get<double>("sample_max_value", c.sample_max_value);
  c.rescale_betas_zero_snr = cfg.get<bool>("rescale_betas_zero_snr", c.rescale_betas_zero_snr);

  c.solver_order = cfg.get<int64_t>("solver_order", c.solver_order);
  c.solver_type = cfg.get_optional<std::string>("solver_type");
  c.lower_order_final = cfg.get<bool>("lower_order_final", c.lower_order_final);
  c.use_karras_sigmas = cfg.get<bool>("use_karras_sigmas", c.use_karras_sigmas);
  c.algorithm_type = cfg.get<std::string>("algorithm_type", c.algorithm_type);
  c.euler_at_final = cfg.get<bool>("euler_at_final", c.euler_at_final);
  c.use_lu_lambdas = cfg.get<bool>("use_lu_lambdas", c.use_lu_lambdas);
  if (auto v = special_number(cfg, c, "lambda_min_clipped")) c.lambda_min_clipped = *v;

  c.interpolation_type = cfg.get<std::string>("interpolation_type", c.interpolation_type);
  c.sigma_min = special_number(cfg, c, "sigma_min");
  c.sigma_max = special_number(cfg, c, "sigma_max");
  c.timestep_type = cfg.get<std::string>("timestep_type", c.timestep_type);

  c.predict_x0 = cfg.get<bool>("predict_x0", c.predict_x0);
  c.disable_corrector = cfg.get<std::vector<int64_t>>("disable_corrector", c.disable_corrector);
  return c;
}

std::pair<double, double> SchedulerConfig::beta_range(const std::string& cls) const {
  // diffusers gives HeunDiscreteScheduler "sensible defaults" (SD's range); every other class DDPM's.
  const bool heun = cls == "HeunDiscreteScheduler";
  return {beta_start.value_or(heun ? 0.00085 : 0.0001), beta_end.value_or(heun ? 0.012 : 0.02)};
}

std::string SchedulerConfig::resolved_solver_type(const std::string& cls) const {
  if (cls == "UniPCMultistepScheduler") {
    const std::string type = solver_type.value_or("bh2");
    return type == "midpoint" || type == "heun" || type == "logrho" ? "bh2" : type;
  }
  const std::string type = solver_type.value_or("midpoint");
  return type == "bh1" || type == "bh2" || type == "logrho" ? "midpoint" : type;
}

SchedulerConfig SchedulerConfig::load(const std::filesystem::path& path) {
  return from_json(sd::io::JsonConfig::load(path));
}

json SchedulerConfig::to_json(const std::string& cls) const {
  json out = json::object();
  for (auto it = original.begin(); it != original.end(); ++it)
    if (!it.key().empty() && it.key()[0] != '_') out[it.key()] = it.value();

  const bool ddpm = cls == "DDPMScheduler", ddim = cls == "DDIMScheduler", pndm = cls == "PNDMScheduler";
  const bool euler = cls == "EulerDiscreteScheduler";
  const bool dpm = cls == "DPMSolverMultistepScheduler", unipc = cls == "UniPCMultistepScheduler";
  const bool heun = cls == "HeunDiscreteScheduler", lms = cls == "LMSDiscreteScheduler";

  out["num_train_timesteps"] = num_train_timesteps;
  const auto [start, end] = beta_range(cls);
  out["beta_start"] = start;
  out["beta_end"] = end;
  out["beta_schedule"] = beta_schedule;
  out["trained_betas"] = trained_betas ? json(*trained_betas) : json(nullptr);
  out["prediction_type"] = prediction_type;
  out["timestep_spacing"] = timestep_spacing.value_or((ddpm || ddim || pndm) ? "leading" : "linspace");
  out["steps_offset"] = steps_offset;
  if (ddpm || ddim) {
    out["clip_sample"] = clip_sample.value_or(true);
    out["clip_sample_range"] = clip_sample_range;
  }
  if (heun) {
    out["clip_sample"] = clip_sample.value_or(false);
    out["clip_sample_range"] = clip_sample_range;
  }
  if (ddpm || ddim || dpm || unipc) {
    out["thresholding"] = thresholding;
    out["dynamic_thresholding_ratio"] = dynamic_thresholding_ratio;
    out["sample_max_value"] = sample_max_value;
  }
  if (ddpm) out["variance_type"] = variance_type.value_or("fixed_small");
  if (ddim) {
    out["set_alpha_to_one"] = set_alpha_to_one.value_or(true);
    out["rescale_betas_zero_snr"] = rescale_betas_zero_snr;
  }
  if (ddpm && rescale_betas_zero_snr) out["rescale_betas_zero_snr"] = true;
  if (pndm) {
    out["skip_prk_steps"] = skip_prk_steps;
    out["set_alpha_to_one"] = set_alpha_to_one.value_or(false);
  }
  if (euler || heun || lms || dpm || unipc) out["use_karras_sigmas"] = use_karras_sigmas;
  if (dpm || unipc) {
    out["solver_order"] = solver_order;
    out["solver_type"] = resolved_solver_type(cls);
    out["lower_order_final"] = lower_order_final;
  }
  if (euler) {
    out["interpolation_type"] = interpolation_type;
    out["sigma_min"] = sigma_min ? json(*sigma_min) : json(nullptr);
    out["sigma_max"] = sigma_max ? json(*sigma_max) : json(nullptr);
    out["timestep_type"] = timestep_type;
  }
  if (dpm) {
    out["algorithm_type"] = algorithm_type;
    out["euler_at_final"] = euler_at_final;
    out["use_lu_lambdas"] = use_lu_lambdas;
    out["variance_type"] = variance_type ? json(*variance_type) : json(nullptr);
    // JSON has no -Infinity; leaving the key out gives diffusers' default (-inf) back on load.
    if (std::isfinite(lambda_min_clipped))
      out["lambda_min_clipped"] = lambda_min_clipped;
    else
      out.erase("lambda_min_clipped");
  }
  if (unipc) {
    out["predict_x0"] = predict_x0;
    out["disable_corrector"] = disable_corrector;
    out["solver_p"] = nullptr;  // another scheduler object; UniPCMultistepScheduler refuses anything else
  }
  out["_class_name"] = cls;
  out["_diffusers_version"] = "0.24.0";
  return out;
}

at::Tensor make_betas(const SchedulerConfig& c, const std::string& class_name, bool allow_sigmoid) {
  const int64_t n = c.num_train_timesteps;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const auto [start, end] = c.beta_range(class_name);
  if (c.trained_betas) return float_tensor(*c.trained_betas);
  if (c.beta_schedule == "linear") return at::linspace(start, end, n, f32);
  if (c.beta_schedule == "scaled_linear")
    // The latent-diffusion schedule: linear in sqrt(beta).
    return at::linspace(std::pow(start, 0.5), std::pow(end, 0.5), n, f32).pow(2);
  if (c.beta_schedule == "squaredcos_cap_v2") return float_tensor(cosine_betas(n));
  if (c.beta_schedule == "sigmoid" && allow_sigmoid)
    return at::sigmoid(at::linspace(-6, 6, n, f32)) * (end - start) + start;
  c.fail_key("beta_schedule", fmt::format("\"{}\" is not supported by {}", c.beta_schedule, class_name));
}

at::Tensor rescale_zero_terminal_snr(const at::Tensor& betas) {
  const at::Tensor alphas = 1.0 - betas;
  const at::Tensor alphas_cumprod = at::cumprod(alphas, 0);
  at::Tensor alphas_bar_sqrt = alphas_cumprod.sqrt();
  const at::Tensor sqrt_0 = alphas_bar_sqrt[0].clone();
  const at::Tensor sqrt_T = alphas_bar_sqrt[-1].clone();
  // Shift so the last timestep has zero SNR, then scale so the first keeps its value.
  alphas_bar_sqrt -= sqrt_T;
  alphas_bar_sqrt *= sqrt_0 / (sqrt_0 - sqrt_T);
  const at::Tensor alphas_bar = alphas_bar_sqrt.pow(2);
  const int64_t n = alphas_bar.size(0);
  const at::Tensor ratios = alphas_bar.slice(0, 1, n) / alphas_bar.slice(0, 0, n - 1);
  return 1 - at::cat({alphas_bar.slice(0, 0, 1), ratios});
}

}  // namespace sd::schedulers
