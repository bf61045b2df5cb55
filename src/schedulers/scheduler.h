// The noise-scheduler interface the sampling loops and training use, mirroring diffusers 0.24's SchedulerMixin:
// set_timesteps, timesteps, init_noise_sigma, scale_model_input, step, add_noise (stateful: PNDM's ets,
// DPM-Solver's history and every scheduler's step index live inside the object).
#pragma once
#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "schedulers/scheduler_config.h"

namespace sd::schedulers {

// Where a stochastic step gets its N(0,1) draw: an explicit tensor (tests replay diffusers' saved draws), a
// generator (drawn as torch.randn(sample.shape, generator=g, dtype=sample.dtype), so a CPU generator with the
// same seed gives diffusers' exact stream), or nothing (the global default generator, like generator=None).
class Noise {
 public:
  Noise() = default;
  Noise(at::Tensor noise) : tensor_(std::move(noise)) {}                // NOLINT: implicit on purpose
  Noise(at::Generator generator) : generator_(std::move(generator)) {}  // NOLINT
  // A draw shaped and typed like `like` (on its device).
  at::Tensor draw(const at::Tensor& like) const;
  bool has_generator() const { return generator_.has_value(); }
  bool has_tensor() const { return tensor_.defined(); }

 private:
  at::Tensor tensor_;
  std::optional<at::Generator> generator_;
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerConfig config) : config_(std::move(config)) {}
  virtual ~Scheduler() = default;
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // diffusers' class name ("PNDMScheduler", ...).
  virtual std::string class_name() const = 0;
  const SchedulerConfig& config() const { return config_; }
  // The config as diffusers 0.24 would save it for this class.
  nlohmann::json to_json() const { return config_.to_json(class_name()); }

  // Builds the inference timestep table and resets all per-run state. steps < 1 throws sd::Error.
  virtual void set_timesteps(int num_inference_steps) = 0;
  // int64 for DDPM/DDIM/PNDM/DPM-Solver, float32 for the Euler schedulers (as diffusers).
  const at::Tensor& timesteps() const { return timesteps_; }
  // float32 sigma table for the sigma-based schedulers (undefined for the others).
  const at::Tensor& sigmas() const { return sigmas_; }
  int num_inference_steps() const { return num_inference_steps_; }
  virtual double init_noise_sigma() const { return 1.0; }
  // Model calls per inference step (diffusers' `order`): 2 for Heun, whose table repeats every timestep but the
  // first; img2img skips `order` table entries per skipped step.
  virtual int order() const { return 1; }

  // sample: [N, C, H, W]; t: one entry of timesteps() (0-dim).
  virtual at::Tensor scale_model_input(const at::Tensor& sample, const at::Tensor& t) { return sample; }
  // One reverse step: returns prev_sample (x_{t-1}).
  virtual at::Tensor step(const at::Tensor& model_output, const at::Tensor& t, const at::Tensor& sample,
                          Noise noise = {}) = 0;
  // Whether step() uses a noise draw (DDPM, DDIM with eta > 0, EulerAncestral, the SDE DPM-Solvers), so a
  // pipeline knows to draw one per image from that image's generator.
  virtual bool step_draws_noise() const { return false; }
  // The forward process at `timesteps` ([N], entries of timesteps() or training timesteps): what img2img starts
  // from. original, noise: [N, ...]. The default is the VP form sqrt(acp[t]) x0 + sqrt(1 - acp[t]) noise.
  virtual at::Tensor add_noise(const at::Tensor& original, const at::Tensor& noise, const at::Tensor& timesteps) const;
  // The x_0 prediction of the last step() for the schedulers whose diffusers step() returns it (DDPM, DDIM,
  // Euler, EulerAncestral); undefined otherwise.
  const at::Tensor& pred_original_sample() const { return pred_original_sample_; }

  // float32 training tables (as diffusers builds them).
  const at::Tensor& betas() const { return betas_; }
  const at::Tensor& alphas_cumprod() const { return alphas_cumprod_; }

 protected:
  // Shared validation of set_timesteps' argument.
  void check_steps(int num_inference_steps) const;
  // Sets betas_ and alphas_cumprod_ (float32, as diffusers: alphas = 1 - betas; cumprod in float32).
  void init_tables(const at::Tensor& betas);
  // The resolved timestep_spacing: the file's value if present, else this class's default.
  std::string spacing(const std::string& class_default) const {
    return config_.timestep_spacing.value_or(class_default);
  }

  SchedulerConfig config_;
  at::Tensor betas_, alphas_cumprod_;
  at::Tensor timesteps_, sigmas_;
  at::Tensor pred_original_sample_;
  int num_inference_steps_ = 0;
};

// values [N] (one scalar per sample) shaped [N, 1, ...] to broadcast over `like` [N, ...].
at::Tensor broadcast_per_sample(at::Tensor values, const at::Tensor& like);

// x_t = sqrt(acp[t]) * x0 + sqrt(1 - acp[t]) * noise, computed in the samples' dtype like diffusers.
// original, noise: [N, ...]; timesteps: [N] int64.
at::Tensor add_noise(const at::Tensor& alphas_cumprod, const at::Tensor& original, const at::Tensor& noise,
                     const at::Tensor& timesteps);
// The v-prediction target: sqrt(acp[t]) * noise - sqrt(1 - acp[t]) * x0.
at::Tensor get_velocity(const at::Tensor& alphas_cumprod, const at::Tensor& sample, const at::Tensor& noise,
                        const at::Tensor& timesteps);

// Where `t` sits in `timesteps`, as diffusers' schedulers find their step index: the second match when t occurs
// twice (a run started mid-table, as img2img does, must not repeat a sigma), nullopt when absent.
std::optional<int64_t> index_of_timestep(const at::Tensor& timesteps, const at::Tensor& t);

// Integer inference timesteps for DDPM/DDIM (and the values Euler uses as float): diffusers' three spacings,
// computed with numpy's arithmetic (float64 linspace / arange, round half to even).
std::vector<double> spaced_timesteps(const std::string& spacing, int64_t num_train_timesteps, int64_t n,
                                     int64_t steps_offset, bool round_linspace);

}  // namespace sd::schedulers
