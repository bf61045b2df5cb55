// Noise levels sigma = sqrt((1 - acp) / acp) as the schedulers that step in them build their tables: k-diffusion's
// Euler, Heun and LMS, and DPM-Solver / UniPC through the VP view of sigma. Tables follow diffusers' numpy
// arithmetic (float32 sigmas, float64 interpolation), so they match to the last ulp or so.
#pragma once
#include <ATen/ATen.h>

#include <utility>
#include <vector>

namespace sd::schedulers {

// sigma(t) for every training timestep t, computed in float32 as diffusers does (returned as doubles).
std::vector<double> training_sigmas(const at::Tensor& alphas_cumprod);

// Karras et al. (2022), eq. 5 with rho = 7: n sigmas from sigma_max down to sigma_min, evenly spaced in
// sigma^(1/rho), in float64.
std::vector<double> karras_sigmas(double sigma_min, double sigma_max, int64_t n);

// The fractional training timestep of each sigma: log sigma interpolated linearly between the two training
// timesteps around it, clamped to the table (diffusers' _sigma_to_t, including its float32 arithmetic).
std::vector<double> sigmas_to_timesteps(const std::vector<double>& sigmas, const std::vector<double>& training_sigmas);

// The VP view of a sigma: alpha_t = 1 / sqrt(sigma^2 + 1), sigma_t = sigma * alpha_t.
std::pair<at::Tensor, at::Tensor> alpha_sigma(const at::Tensor& sigma);
// log(alpha_t) - log(sigma_t): the half log-SNR in which DPM-Solver and UniPC take their steps.
at::Tensor lambda_of(const at::Tensor& alpha_t, const at::Tensor& sigma_t);

// A 1-D tensor of `dtype` from float64 values (torch.from_numpy(values).to(dtype)), and back.
at::Tensor to_tensor(const std::vector<double>& values, at::ScalarType dtype);
std::vector<double> to_doubles(const at::Tensor& values);

}  // namespace sd::schedulers
