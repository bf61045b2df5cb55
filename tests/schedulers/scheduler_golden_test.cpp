// Parity of the six schedulers with diffusers 0.24: the fixtures' step sequences (golden/schedulers/, C5) replayed
// exactly as the fixtures README describes, the timestep/sigma tables of every spacing, and DDPM's training helpers.
#include <iostream>

#include "io/safetensors.h"
#include "schedulers/ddpm.h"
#include "schedulers/factory.h"
#include "io/json_config.h"
#include "test_util.h"

namespace sd::schedulers {
namespace {

using nlohmann::json;
using sd::test::close_rel_max;

constexpr double kTol = 1e-4;  // README: scheduler outputs

// The sidecars come from Python's json (lambda_min_clipped is -Infinity).
json read_json(const std::filesystem::path& path) { return sd::io::JsonConfig::load(path).raw(); }

struct Golden {
  json meta;
  sd::io::TensorMap tensors;
  const at::Tensor& at(const std::string& key) const {
    auto it = tensors.find(key);
    if (it == tensors.end()) throw std::runtime_error("golden tensor missing: " + key);
    return it->second;
  }
  bool has(const std::string& key) const { return tensors.count(key) > 0; }
};

const Golden& golden(const std::string& name) {
  static std::map<std::string, Golden> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    Golden g{read_json(sd::test::golden("schedulers/" + name + ".json")),
             sd::io::load_safetensors(sd::test::golden("schedulers/" + name + ".safetensors"))};
    it = cache.emplace(name, std::move(g)).first;
  }
  return it->second;
}

// The config the goldens were made from: BASE | {prediction_type} (| overrides), class defaults for the rest.
SchedulerConfig config_for(const Golden& g, const json& overrides) {
  json cfg = g.meta["base_config"];
  for (auto it = overrides.begin(); it != overrides.end(); ++it) cfg[it.key()] = it.value();
  return SchedulerConfig::from_json(sd::io::JsonConfig(cfg, "golden base_config"));
}

// max|err| / max|ref|, for the report of how close we land.
double ratio(const at::Tensor& actual, const at::Tensor& expected) {
  const auto a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  return (a - e).abs().max().item<double>() / e.abs().max().item<double>();
}

// Integer tables exactly (dtype included); float tables within 1e-6 relative.
::testing::AssertionResult same_timesteps(const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.scalar_type() != expected.scalar_type())
    return ::testing::AssertionFailure() << "dtype " << actual.scalar_type() << " != " << expected.scalar_type();
  if (at::isIntegralType(expected.scalar_type(), false)) {
    if (actual.sizes() == expected.sizes() && at::equal(actual, expected)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "timesteps " << actual << " != expected " << expected;
  }
  return close_rel_max(actual, expected, 1e-6);
}

struct Case {
  std::string file;       // golden/schedulers/<file>
  std::string scheduler;  // name given to make_scheduler
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.file << " via " << c.scheduler; }

class SchedulerGolden : public ::testing::TestWithParam<Case> {};

TEST_P(SchedulerGolden, ReplaysEveryStep) {
  const Case& c = GetParam();
  const Golden& g = golden(c.file);
  const at::Tensor latents = g.at("input.latents");
  const at::Tensor C = g.at("input.C");
  double worst = 0;
  for (const std::string pt : {"epsilon", "v_prediction"}) {
    for (int n : {10, 25}) {
      SCOPED_TRACE(pt + ".n" + std::to_string(n));
      const std::string p = pt + ".n" + std::to_string(n) + ".";
      auto sched = make_scheduler(config_for(g, {{"prediction_type", pt}}), c.scheduler);
      sched->set_timesteps(n);
      ASSERT_TRUE(same_timesteps(sched->timesteps(), g.at(p + "timesteps")));
      if (g.has(p + "sigmas")) {
        ASSERT_TRUE(close_rel_max(sched->sigmas(), g.at(p + "sigmas"), 1e-6));
        EXPECT_EQ(sched->sigmas().scalar_type(), at::kFloat);
      }
      EXPECT_EQ(sched->init_noise_sigma(), g.meta["init_noise_sigma"][pt + ".n" + std::to_string(n)].get<double>());

      at::Tensor x = latents * sched->init_noise_sigma();
      ASSERT_TRUE(close_rel_max(x, g.at(p + "initial_sample"), kTol));
      const at::Tensor timesteps = sched->timesteps();
      int noise_k = 0;
      for (int64_t i = 0; i < timesteps.size(0); ++i) {
        SCOPED_TRACE("step " + std::to_string(i));
        const std::string s = p + "step" + std::to_string(i) + ".";
        const at::Tensor t = timesteps[i];
        const at::Tensor inp = sched->scale_model_input(x, t);
        ASSERT_TRUE(close_rel_max(inp, g.at(s + "model_input"), kTol));
        worst = std::max(worst, ratio(inp, g.at(s + "model_input")));
        const at::Tensor model_output = 0.1 * inp + C;
        // Schedulers that draw inside step() consume the saved draws in order.
        const std::string noise_key = p + "noise" + std::to_string(noise_k);
        Noise noise;
        if (g.has(noise_key)) {
          noise = Noise(g.at(noise_key));
          ++noise_k;
        }
        x = sched->step(model_output, t, x, noise);
        ASSERT_TRUE(close_rel_max(x, g.at(s + "prev_sample"), kTol));
        worst = std::max(worst, ratio(x, g.at(s + "prev_sample")));
        if (g.has(s + "pred_original_sample")) {
          ASSERT_TRUE(sched->pred_original_sample().defined());
          ASSERT_TRUE(close_rel_max(sched->pred_original_sample(), g.at(s + "pred_original_sample"), kTol));
          worst = std::max(worst, ratio(sched->pred_original_sample(), g.at(s + "pred_original_sample")));
        } else {
          EXPECT_FALSE(sched->pred_original_sample().defined());
        }
      }
      // Every saved draw was consumed, and by a scheduler that draws.
      EXPECT_FALSE(g.has(p + "noise" + std::to_string(noise_k)));
    }
  }
  std::cout << "[ worst    ] " << c.file << ": max|err|/max|ref| = " << worst << "\n";
}

TEST_P(SchedulerGolden, TimestepTablesForEverySpacing) {
  const Case& c = GetParam();
  const Golden& g = golden(c.file);
  for (const std::string spacing : {"leading", "linspace", "trailing"}) {
    for (int n : {10, 25}) {
      SCOPED_TRACE(spacing + ".n" + std::to_string(n));
      const std::string p = "spacing." + spacing + ".n" + std::to_string(n) + ".";
      auto sched = make_scheduler(config_for(g, {{"timestep_spacing", spacing}}), c.scheduler);
      sched->set_timesteps(n);
      EXPECT_TRUE(same_timesteps(sched->timesteps(), g.at(p + "timesteps")));
      if (g.has(p + "sigmas")) {
        EXPECT_TRUE(close_rel_max(sched->sigmas(), g.at(p + "sigmas"), 1e-6));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Diffusers024, SchedulerGolden,
                         ::testing::Values(Case{"ddpm", "ddpm"}, Case{"ddim", "DDIMScheduler"}, Case{"pndm", "pndm"},
                                           Case{"euler", "euler"}, Case{"euler_ancestral", "euler_a"},
                                           Case{"dpmsolver_multistep", "dpmsolver++"}),
                         [](const auto& info) { return info.param.file; });

TEST(SchedulerGoldenTraining, AddNoiseAndVelocity) {
  const Golden& g = golden("ddpm_training");
  DDPMScheduler sched(config_for(golden("ddpm"), json::object()));
  const at::Tensor x0 = g.at("input.original_samples"), noise = g.at("input.noise"), t = g.at("input.timesteps");
  const at::Tensor noisy = sched.add_noise(x0, noise, t);
  const at::Tensor velocity = sched.get_velocity(x0, noise, t);
  EXPECT_TRUE(close_rel_max(noisy, g.at("add_noise"), kTol));
  EXPECT_TRUE(close_rel_max(velocity, g.at("get_velocity"), kTol));
  std::cout << "[ worst    ] ddpm_training: add_noise " << ratio(noisy, g.at("add_noise")) << ", get_velocity "
            << ratio(velocity, g.at("get_velocity")) << "\n";
}

TEST(SchedulerGoldenTraining, BetaTables) {
  const Golden& g = golden("ddpm_training");
  const std::map<std::string, json> configs = {
      {"scaled_linear", golden("ddpm").meta["base_config"]},
      {"linear", json::object()},  // DDPMScheduler() defaults: linear 1e-4 .. 0.02
      {"squaredcos_cap_v2", {{"beta_schedule", "squaredcos_cap_v2"}}},
  };
  for (const auto& [name, cfg] : configs) {
    SCOPED_TRACE(name);
    DDPMScheduler sched(SchedulerConfig::from_json(sd::io::JsonConfig(cfg, name)));
    ASSERT_EQ(sched.betas().scalar_type(), at::kFloat);
    ASSERT_EQ(sched.alphas_cumprod().scalar_type(), at::kFloat);
    EXPECT_TRUE(close_rel_max(sched.betas(), g.at(name + ".betas"), kTol));
    EXPECT_TRUE(close_rel_max(sched.alphas_cumprod(), g.at(name + ".alphas_cumprod"), kTol));
    std::cout << "[ worst    ] " << name << ": betas " << ratio(sched.betas(), g.at(name + ".betas"))
              << ", alphas_cumprod " << ratio(sched.alphas_cumprod(), g.at(name + ".alphas_cumprod")) << "\n";
  }
}

// The scheduler half of the txt2img goldens (C8): the UNet outputs are replayed from the golden, guidance applied
// as the pipeline does, and every latent the pipeline saw is compared.
TEST(SchedulerGoldenTxt2img, Sd1PipelineSchedulers) {
  const auto config = sd::test::fixtures() / "tiny-sd1/scheduler/scheduler_config.json";
  for (const std::string name : {"pndm", "ddim", "euler"}) {
    SCOPED_TRACE(name);
    const json meta = read_json(sd::test::golden("tiny-sd1/txt2img_" + name + ".json"));
    const auto g = sd::io::load_safetensors(sd::test::golden("tiny-sd1/txt2img_" + name + ".safetensors"));
    // pndm is the pipeline's own scheduler (its _class_name); the others are from_config of it.
    auto sched = name == "pndm" ? load_scheduler(config) : load_scheduler(config, name);
    sched->set_timesteps(4);
    ASSERT_TRUE(same_timesteps(sched->timesteps(), g.at("scheduler_timesteps")));
    EXPECT_EQ(sched->init_noise_sigma(), meta["init_noise_sigma"].get<double>());
    at::Tensor latents = g.at("input.latents") * sched->init_noise_sigma();
    double worst = 0;
    for (int64_t i = 0; i < sched->timesteps().size(0); ++i) {
      SCOPED_TRACE(i);
      const std::string s = "step" + std::to_string(i) + ".";
      const at::Tensor t = sched->timesteps()[i];
      EXPECT_TRUE(same_timesteps(t.reshape({1}), g.at(s + "timestep")));
      const at::Tensor inp = sched->scale_model_input(latents, t);
      ASSERT_TRUE(close_rel_max(at::cat({inp, inp}), g.at(s + "unet_input"), kTol));
      const auto chunks = g.at(s + "unet_output").chunk(2);
      const at::Tensor guided = chunks[0] + 7.5 * (chunks[1] - chunks[0]);
      latents = sched->step(guided, t, latents);
      ASSERT_TRUE(close_rel_max(latents, g.at(s + "latents_after"), kTol));
      worst = std::max(worst, ratio(latents, g.at(s + "latents_after")));
    }
    std::cout << "[ worst    ] txt2img_" << name << " latents: " << worst << "\n";
  }
}

}  // namespace
}  // namespace sd::schedulers
