// The scheduler paths the fixtures have no golden for (Heun, LMS, UniPC, Karras sigmas, DDIM's eta, add_noise),
// each checked against an independent float64 re-derivation of diffusers 0.24's formulas written here, on SD's
// scheduler settings: tables to 1e-6 (integer tables exactly), sample trajectories to the fixtures README's 1e-4
// of max|ref|.
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "io/json_config.h"
#include "schedulers/ddim.h"
#include "schedulers/factory.h"
#include "schedulers/lms.h"
#include "test_util.h"

namespace sd::schedulers {
namespace {

using nlohmann::json;
using sd::test::close_rel_max;

constexpr double kTol = 1e-4;  // README: scheduler outputs

json sd_base() {
  return {{"num_train_timesteps", 1000},      {"beta_start", 0.00085}, {"beta_end", 0.012},
          {"beta_schedule", "scaled_linear"}, {"steps_offset", 1},     {"clip_sample", false},
          {"set_alpha_to_one", false}};
}

std::unique_ptr<Scheduler> make(const std::string& name, const json& overrides = json::object(), int steps = 10) {
  json cfg = sd_base();
  for (auto it = overrides.begin(); it != overrides.end(); ++it) cfg[it.key()] = it.value();
  auto s = make_scheduler(SchedulerConfig::from_json(sd::io::JsonConfig(cfg, "test.json")), name);
  s->set_timesteps(steps);
  return s;
}

std::vector<double> doubles(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

at::Tensor f64(const std::vector<double>& v) { return at::tensor(v, at::kDouble); }

// SD's training sigmas sqrt((1 - acp) / acp), in float64 from the scheduler's float32 alphas_cumprod.
std::vector<double> training_sigmas(const Scheduler& s) {
  std::vector<double> out;
  for (double a : doubles(s.alphas_cumprod())) out.push_back(std::sqrt((1 - a) / a));
  return out;
}

// Karras et al. (2022) eq. 5, rho = 7.
std::vector<double> karras(double sigma_min, double sigma_max, int n) {
  std::vector<double> out;
  for (int i = 0; i < n; ++i) {
    const double ramp = static_cast<double>(i) / (n - 1);
    const double inv =
        std::pow(sigma_max, 1 / 7.0) + ramp * (std::pow(sigma_min, 1 / 7.0) - std::pow(sigma_max, 1 / 7.0));
    out.push_back(std::pow(inv, 7));
  }
  return out;
}

// The training timestep where log sigma(t), linear between integers, equals log sigma.
double timestep_of(double sigma, const std::vector<double>& table) {
  const double ls = std::log(sigma);
  for (size_t t = 0; t + 1 < table.size(); ++t) {
    const double lo = std::log(table[t]), hi = std::log(table[t + 1]);
    if (ls >= lo && ls <= hi) return static_cast<double>(t) + (ls - lo) / (hi - lo);
  }
  return ls < std::log(table.front()) ? 0.0 : static_cast<double>(table.size() - 1);
}

// The fixtures' replay (C5): x = latents * init_noise_sigma, model_output = 0.1 * scaled input + C.
struct Replay {
  at::Tensor latents = at::randn({1, 4, 8, 8}, at::kDouble);
  at::Tensor C = at::randn({1, 4, 8, 8}, at::kDouble);
};

// Runs the C++ scheduler on the replay, and checks every prev_sample against `reference(i, x) -> next x`, which
// walks the same table in float64.
void expect_trajectory(Scheduler& s, const Replay& r,
                       const std::function<at::Tensor(int64_t, const at::Tensor&)>& reference) {
  at::Tensor x = (r.latents * s.init_noise_sigma()).to(at::kFloat);
  at::Tensor expected = r.latents * s.init_noise_sigma();
  for (int64_t i = 0; i < s.timesteps().size(0); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    const at::Tensor t = s.timesteps()[i];
    x = s.step(0.1 * s.scale_model_input(x, t) + r.C.to(at::kFloat), t, x);
    expected = reference(i, expected);
    ASSERT_TRUE(close_rel_max(x, expected, kTol));
  }
}

TEST(KarrasSigmas, TablesFollowTheRampAndLogSigmaInterpolation) {
  for (const std::string name : {"euler", "heun", "lms", "dpm++", "unipc"}) {
    SCOPED_TRACE(name);
    auto s = make(name, {{"use_karras_sigmas", true}});
    // linspace spacing (these classes' default) spans the whole training table, so every class ramps between
    // the training sigmas of t = 0 and t = 999.
    const std::vector<double> table = training_sigmas(*s);
    const std::vector<double> expected = karras(table.front(), table.back(), 10);
    std::vector<double> timesteps;
    for (double sigma : expected) timesteps.push_back(timestep_of(sigma, table));

    const std::vector<double> sigmas = doubles(s->sigmas());
    std::vector<double> got_sigmas, got_timesteps = doubles(s->timesteps());
    if (name == "heun") {
      // Every sigma and timestep after the first is visited twice.
      ASSERT_EQ(sigmas.size(), 20u);
      std::vector<double> once;
      for (size_t i = 0; i < 10; ++i) {
        got_sigmas.push_back(sigmas[i == 0 ? 0 : 2 * i - 1]);
        once.push_back(got_timesteps[i == 0 ? 0 : 2 * i - 1]);
        if (i > 0) {
          EXPECT_EQ(got_timesteps[2 * i - 1], got_timesteps[2 * i]);
        }
      }
      got_timesteps = once;
    } else {
      ASSERT_EQ(sigmas.size(), 11u);
      got_sigmas.assign(sigmas.begin(), sigmas.begin() + 10);
    }
    EXPECT_TRUE(close_rel_max(f64(got_sigmas), f64(expected), 1e-6));
    const bool multistep = name == "dpm++" || name == "unipc";
    // The last step goes to 0 (k-diffusion samplers) or stays at sigma_min (multistep solvers, as diffusers 0.24).
    EXPECT_EQ(sigmas.back(), multistep ? sigmas[sigmas.size() - 2] : 0.0);
    if (multistep) {
      ASSERT_EQ(s->timesteps().scalar_type(), at::kLong);
      std::vector<double> rounded;
      for (double t : timesteps) rounded.push_back(std::nearbyint(t));
      EXPECT_EQ(got_timesteps, rounded);
    } else {
      EXPECT_TRUE(close_rel_max(f64(got_timesteps), f64(timesteps), 1e-6));
      // diffusers casts Karras timesteps to float32 in EulerDiscrete only; Heun and LMS keep numpy's float64.
      EXPECT_EQ(s->timesteps().scalar_type(), name == "euler" ? at::kFloat : at::kDouble);
    }
  }
}

TEST(KarrasSigmas, EulerTakesItsRangeFromTheConfigWhenGiven) {
  auto s = make("euler", {{"use_karras_sigmas", true}, {"sigma_min", 0.1}, {"sigma_max", 10.0}});
  EXPECT_TRUE(close_rel_max(s->sigmas().slice(0, 0, 10), f64(karras(0.1, 10.0, 10)), 1e-6));
  // The Karras spellings of the factory switch the option on.
  EXPECT_TRUE(make("dpm++_karras")->config().use_karras_sigmas);
  EXPECT_TRUE(make("euler_karras")->config().use_karras_sigmas);
  EXPECT_FALSE(make("dpm++")->config().use_karras_sigmas);
}

TEST(HeunDiscrete, TableVisitsEveryTimestepAfterTheFirstTwice) {
  auto heun = make("heun");
  auto euler = make("euler");
  const std::vector<double> h = doubles(heun->timesteps()), e = doubles(euler->timesteps());
  const std::vector<double> hs = doubles(heun->sigmas()), es = doubles(euler->sigmas());
  ASSERT_EQ(h.size(), 19u);
  ASSERT_EQ(hs.size(), 20u);
  EXPECT_EQ(heun->order(), 2);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(h[i == 0 ? 0 : 2 * i - 1], e[i]);
    if (i > 0) {
      EXPECT_EQ(h[2 * i], e[i]);
    }
    EXPECT_EQ(hs[i == 0 ? 0 : 2 * i - 1], es[i]);
  }
  EXPECT_EQ(hs.back(), 0.0);
  EXPECT_EQ(heun->init_noise_sigma(), euler->init_noise_sigma());
}

// Heun's method on dx/dsigma = (x - x0(x, sigma)) / sigma: an Euler step, then the average of both slopes.
TEST(HeunDiscrete, StepsAreHeunsMethodInSigma) {
  for (const std::string prediction : {"epsilon", "v_prediction"}) {
    SCOPED_TRACE(prediction);
    auto s = make("heun", {{"prediction_type", prediction}});
    const std::vector<double> sigmas = doubles(s->sigmas());
    const Replay r;
    const bool v = prediction == "v_prediction";
    // The replay's model sees x / sqrt(sigma^2 + 1).
    auto x0 = [&](const at::Tensor& x, double sigma) {
      const at::Tensor out = 0.1 * x / std::sqrt(sigma * sigma + 1) + r.C;
      return v ? out * (-sigma / std::sqrt(sigma * sigma + 1)) + x / (sigma * sigma + 1) : x - sigma * out;
    };
    at::Tensor start, slope;
    expect_trajectory(*s, r, [&](int64_t i, const at::Tensor& x) {
      if (i % 2 == 0) {  // first-order half: sigma[i] -> sigma[i + 1]
        start = x;
        slope = (x - x0(x, sigmas[i])) / sigmas[i];
        return x + slope * (sigmas[i + 1] - sigmas[i]);
      }
      const double sigma = sigmas[i - 1], next = sigmas[i];
      const at::Tensor corrected = ((x - x0(x, next)) / next + slope) / 2;
      return start + corrected * (next - sigma);
    });
  }
}

// The LMS weights integrate Lagrange polynomials: they sum to the step (the polynomials sum to 1), order 1 is
// Euler, and order 2 integrates a line in closed form.
TEST(LMSDiscrete, CoefficientsIntegrateTheLagrangeBasis) {
  auto s = make("lms");
  auto& lms = dynamic_cast<LMSDiscreteScheduler&>(*s);
  const std::vector<double> sig = doubles(s->sigmas());
  for (int64_t step = 0; step < 9; ++step) {
    const int order = static_cast<int>(std::min<int64_t>(step + 1, 4));
    double sum = 0;
    for (int j = 0; j < order; ++j) sum += lms.lms_coefficient(order, step, j);
    EXPECT_NEAR(sum, sig[step + 1] - sig[step], 1e-9 * std::abs(sig[step])) << step;
  }
  EXPECT_NEAR(lms.lms_coefficient(1, 0, 0), sig[1] - sig[0], 1e-12);
  // Order 2 at step 1: l_0(tau) = (tau - s0) / (s1 - s0), integrated from s1 to s2.
  const double s0 = sig[0], s1 = sig[1], s2 = sig[2];
  const double l0 = ((s2 - s0) * (s2 - s0) - (s1 - s0) * (s1 - s0)) / (2 * (s1 - s0));
  EXPECT_NEAR(lms.lms_coefficient(2, 1, 0), l0, 1e-9 * std::abs(l0));
  EXPECT_NEAR(lms.lms_coefficient(2, 1, 1), (s2 - s1) - l0, 1e-9 * std::abs(l0));
}

// Simpson's rule is exact for cubics: an independent way to integrate LMS's Lagrange polynomials.
double simpson(const std::function<double(double)>& f, double a, double b) {
  return (b - a) / 6 * (f(a) + 4 * f((a + b) / 2) + f(b));
}

TEST(LMSDiscrete, StepsAreTheLinearMultistepUpdate) {
  for (const json& overrides : {json::object(), json{{"use_karras_sigmas", true}}}) {
    SCOPED_TRACE(overrides.dump());
    auto s = make("lms", overrides);
    const std::vector<double> sig = doubles(s->sigmas());
    const Replay r;
    std::vector<at::Tensor> slopes;
    expect_trajectory(*s, r, [&](int64_t i, const at::Tensor& x) {
      const at::Tensor out = 0.1 * x / std::sqrt(sig[i] * sig[i] + 1) + r.C;
      slopes.push_back(out);  // (x - (x - sigma * out)) / sigma
      const int order = static_cast<int>(std::min<int64_t>(i + 1, 4));
      at::Tensor next = x.clone();
      for (int j = 0; j < order; ++j) {
        auto basis = [&](double tau) {
          double p = 1;
          for (int k = 0; k < order; ++k)
            if (k != j) p *= (tau - sig[i - k]) / (sig[i - j] - sig[i - k]);
          return p;
        };
        next = next + simpson(basis, sig[i], sig[i + 1]) * slopes[slopes.size() - 1 - j];
      }
      return next;
    });
  }
}

// UniPC-2 with B(h) = e^h - 1 on data predictions (Zhao et al. 2023, Algorithms 2-3), written out for orders 1-2:
// predictor x_t = (sigma_t / sigma_s) x - alpha_t (e^-h - 1) m0 - alpha_t B(h) rho_p D1, and the corrector
// re-takes the last step with this step's output m_t, rho from the 2x2 order conditions (1/2 for order 1).
TEST(UniPCMultistep, StepsAreTheBh2PredictorCorrector) {
  for (const json& overrides : {json::object(), json{{"use_karras_sigmas", true}}}) {
    SCOPED_TRACE(overrides.dump());
    auto s = make("unipc", overrides);
    const std::vector<double> sig = doubles(s->sigmas());
    const auto n = static_cast<int64_t>(s->timesteps().size(0));
    auto alpha = [&](int64_t i) { return 1 / std::sqrt(sig[i] * sig[i] + 1); };
    auto sigma_t = [&](int64_t i) { return sig[i] * alpha(i); };
    auto lambda = [&](int64_t i) { return std::log(alpha(i)) - std::log(sigma_t(i)); };
    const Replay r;
    std::vector<at::Tensor> m;  // data predictions so far
    at::Tensor last_x;
    int last_order = 0;
    // One UniP/UniC move from index s to index t with newest output m0 = m[newest] and, for order 2, m[newest - 1].
    auto move = [&](int64_t from, int64_t to, const at::Tensor& x, size_t newest, int order,
                    const at::Tensor* corrector_output) {
      const double h = lambda(to) - lambda(from), hh = -h;
      const double phi1 = std::expm1(hh), B = std::expm1(hh);
      const at::Tensor& m0 = m[newest];
      at::Tensor result = sigma_t(to) / sigma_t(from) * x - alpha(to) * phi1 * m0;
      // b_1 = (phi1 / hh - 1) / B, b_2 = 2 ((phi1 / hh - 1) / hh - 1/2) / B.
      const double g1 = phi1 / hh - 1, b1 = g1 / B, b2 = 2 * (g1 / hh - 0.5) / B;
      if (corrector_output == nullptr) {
        if (order == 2) {
          const double r1 = (lambda(from - 1) - lambda(from)) / h;
          result = result - alpha(to) * B * 0.5 * (m[newest - 1] - m0) / r1;
        }
        return result;
      }
      const at::Tensor D1_t = *corrector_output - m0;
      if (order == 1) return result - alpha(to) * B * 0.5 * D1_t;
      // [[1, 1], [r1, 1]] rho = [b1, b2]
      const double r1 = (lambda(from - 1) - lambda(from)) / h;
      const double rho_t = (b2 - r1 * b1) / (1 - r1), rho_1 = b1 - rho_t;
      return result - alpha(to) * B * (rho_1 * (m[newest - 1] - m0) / r1 + rho_t * D1_t);
    };
    expect_trajectory(*s, r, [&](int64_t i, const at::Tensor& x_in) {
      const at::Tensor out = 0.1 * x_in + r.C;  // UniPC does not scale the input
      const at::Tensor x0 = (x_in - sigma_t(i) * out) / alpha(i);
      at::Tensor x = x_in;
      if (i > 0) x = move(i - 1, i, last_x, m.size() - 1, last_order, &x0);
      m.push_back(x0);
      const int order = static_cast<int>(std::min<int64_t>({2, n - i, static_cast<int64_t>(m.size())}));
      last_x = x;
      last_order = order;
      return move(i, i + 1, x, m.size() - 1, order, nullptr);
    });
  }
}

// DDIM paper eq. 12 with sigma_t(eta) = eta sqrt((1 - a_prev) / (1 - a_t)) sqrt(1 - a_t / a_prev) (eq. 16), and
// the noise drawn from the generator as torch.randn(shape, generator=g).
TEST(DDIMEta, StepAddsTheEtaScaledVarianceNoise) {
  auto s = make("ddim");
  auto& ddim = dynamic_cast<DDIMScheduler&>(*s);
  ddim.set_eta(0.6);
  EXPECT_TRUE(s->step_draws_noise());
  const std::vector<double> acp = doubles(s->alphas_cumprod());
  const Replay r;
  at::Generator gen = at::detail::createCPUGenerator(5);
  at::Generator replay = at::detail::createCPUGenerator(5);
  at::Tensor x = r.latents.to(at::kFloat), expected = r.latents;
  for (int64_t i = 0; i < s->timesteps().size(0); ++i) {
    const int64_t t = s->timesteps()[i].item<int64_t>(), prev = t - 100;
    x = s->step(0.1 * x + r.C.to(at::kFloat), s->timesteps()[i], x, gen);
    const double a = acp[t], a_prev = prev >= 0 ? acp[prev] : acp[0];
    const at::Tensor eps = 0.1 * expected + r.C;
    const at::Tensor pred_x0 = (expected - std::sqrt(1 - a) * eps) / std::sqrt(a);
    const double std_dev = 0.6 * std::sqrt((1 - a_prev) / (1 - a) * (1 - a / a_prev));
    const at::Tensor noise = at::randn({1, 4, 8, 8}, replay).to(at::kDouble);
    expected = std::sqrt(a_prev) * pred_x0 + std::sqrt(1 - a_prev - std_dev * std_dev) * eps + std_dev * noise;
    ASSERT_TRUE(close_rel_max(x, expected, kTol)) << "step " << i;
  }
  // eta = 0 stays deterministic (no draw), and eta outside [0, 1] is refused.
  ddim.set_eta(0);
  EXPECT_FALSE(s->step_draws_noise());
  EXPECT_THROW(ddim.set_eta(1.5), Error);
  EXPECT_THROW(ddim.set_eta(-0.1), Error);
}

// The forward process each family starts img2img from: x0 + sigma n (k-diffusion), alpha_t x0 + sigma_t n
// (DPM-Solver, UniPC), sqrt(acp) x0 + sqrt(1 - acp) n (DDPM, DDIM, PNDM).
TEST(AddNoise, EachFamilysForwardProcessAtTheGivenTimestep) {
  const at::Tensor x0 = at::randn({2, 4, 8, 8}), noise = at::randn({2, 4, 8, 8});
  for (const std::string name : {"euler", "euler_a", "heun", "lms", "dpm++", "unipc", "ddim", "pndm", "ddpm"}) {
    SCOPED_TRACE(name);
    auto s = make(name);
    const int64_t index = 2 * s->order();
    const at::Tensor t = s->timesteps().slice(0, index, index + 1).repeat({2});
    const at::Tensor noisy = s->add_noise(x0, noise, t);
    at::Tensor expected;
    if (name == "dpm++" || name == "unipc") {
      const double sigma = s->sigmas()[index].item<double>(), alpha = 1 / std::sqrt(sigma * sigma + 1);
      expected = alpha * x0 + sigma * alpha * noise;
    } else if (s->sigmas().defined()) {
      expected = x0 + s->sigmas()[index].item<double>() * noise;
    } else {
      const double a = s->alphas_cumprod()[t[0].item<int64_t>()].item<double>();
      expected = std::sqrt(a) * x0 + std::sqrt(1 - a) * noise;
    }
    EXPECT_TRUE(close_rel_max(noisy, expected, 1e-6));
  }
}

}  // namespace
}  // namespace sd::schedulers
