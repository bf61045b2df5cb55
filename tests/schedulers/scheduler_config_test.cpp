// Scheduler configs and the factory: the fixture pipelines' scheduler_config.json files, diffusers' from_config
// behaviour (keys in the file win over class defaults), saving back, every user error, the Noise sources, and
// properties of the code paths the goldens do not reach (PRK warm-up, DPM-Solver variants, zero-SNR rescale).
#include <ATen/CPUGeneratorImpl.h>

#include <fstream>
#include <set>

#include "core/error.h"
#include "schedulers/ddim.h"
#include "schedulers/ddpm.h"
#include "schedulers/euler.h"
#include "schedulers/factory.h"
#include "io/json_config.h"
#include "test_util.h"

namespace sd::schedulers {
namespace {

using nlohmann::json;
using sd::test::close_rel_max;
using sd::test::TempDir;

std::filesystem::path sd1_config() { return sd::test::fixtures() / "tiny-sd1/scheduler/scheduler_config.json"; }
std::filesystem::path sd2_config() { return sd::test::fixtures() / "tiny-sd2/scheduler/scheduler_config.json"; }

json read_json(const std::filesystem::path& path) { return sd::io::JsonConfig::load(path).raw(); }

SchedulerConfig config_of(const json& j) { return SchedulerConfig::from_json(sd::io::JsonConfig(j, "test.json")); }

// SD's scheduler settings, as the fixtures' base_config.
json sd_base() {
  return {{"num_train_timesteps", 1000},      {"beta_start", 0.00085}, {"beta_end", 0.012},
          {"beta_schedule", "scaled_linear"}, {"steps_offset", 1},     {"clip_sample", false},
          {"set_alpha_to_one", false},        {"skip_prk_steps", true}};
}

json with(json j, const json& overrides) {
  for (auto it = overrides.begin(); it != overrides.end(); ++it) j[it.key()] = it.value();
  return j;
}

// The message of the sd::Error `fn` throws ("" when it throws none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string write_config(const TempDir& dir, const std::string& text) {
  const auto path = dir.path() / "scheduler_config.json";
  std::ofstream(path) << text;
  return path.string();
}

TEST(SchedulerConfigFixtures, Sd1BuildsPndmAndSd2BuildsDdim) {
  auto sd1 = load_scheduler(sd1_config());
  EXPECT_EQ(sd1->class_name(), "PNDMScheduler");
  auto sd2 = load_scheduler(sd2_config());
  EXPECT_EQ(sd2->class_name(), "DDIMScheduler");
  // SD's table: steps_offset 1 with leading spacing; PLMS repeats the second timestep.
  sd1->set_timesteps(4);
  EXPECT_TRUE(at::equal(sd1->timesteps(), at::tensor({751, 501, 501, 251, 1}, at::kLong)));
  sd2->set_timesteps(4);
  EXPECT_TRUE(at::equal(sd2->timesteps(), at::tensor({751, 501, 251, 1}, at::kLong)));
}

TEST(SchedulerConfigFixtures, SavesBackWhatDiffusersWrote) {
  // Both files were written by diffusers 0.24's save_pretrained; re-saving must give the same JSON.
  for (const auto& path : {sd1_config(), sd2_config()}) {
    SCOPED_TRACE(path.string());
    EXPECT_EQ(load_scheduler(path)->to_json(), read_json(path));
  }
}

TEST(SchedulerConfigFixtures, FromConfigOfAnotherClassKeepsTheFilesKeys) {
  // txt2img goldens: EulerDiscreteScheduler / DDIMScheduler .from_config(the sd1 PNDM config).
  for (const std::string name : {"euler", "ddim"}) {
    SCOPED_TRACE(name);
    const json meta = read_json(sd::test::golden("tiny-sd1/txt2img_" + name + ".json"));
    auto sched = load_scheduler(sd1_config(), name);
    json saved = sched->to_json();
    EXPECT_EQ(saved["_class_name"], sched->class_name());
    saved.erase("_class_name");
    saved.erase("_diffusers_version");
    EXPECT_EQ(saved, meta["resolved_scheduler_config"]);
    // timestep_spacing 'leading' comes from the file, not Euler's 'linspace' default, and decides init_noise_sigma.
    sched->set_timesteps(4);
    EXPECT_EQ(sched->init_noise_sigma(), meta["init_noise_sigma"].get<double>());
  }
}

TEST(SchedulerConfigFixtures, ClassDefaultsApplyWhenTheFileOmitsAKey) {
  const json no_spacing = sd_base();
  auto euler = make_scheduler(config_of(no_spacing), "euler");
  euler->set_timesteps(10);
  EXPECT_EQ(euler->timesteps()[0].item<float>(), 999.0f);  // linspace
  auto ddim = make_scheduler(config_of(no_spacing), "ddim");
  ddim->set_timesteps(10);
  EXPECT_EQ(ddim->timesteps()[0].item<int64_t>(), 901);  // leading + steps_offset
  // clip_sample / set_alpha_to_one defaults differ per class too.
  EXPECT_TRUE(make_scheduler(config_of(json::object()), "ddim")->to_json()["set_alpha_to_one"].get<bool>());
  EXPECT_FALSE(make_scheduler(config_of(json::object()), "pndm")->to_json()["set_alpha_to_one"].get<bool>());
  EXPECT_TRUE(make_scheduler(config_of(json::object()), "ddpm")->to_json()["clip_sample"].get<bool>());
}

// The keys diffusers 0.24's save_pretrained writes for the classes with no fixture file, with their defaults.
TEST(SchedulerConfigFixtures, NewClassesSaveDiffusersKeys) {
  const std::set<std::string> common = {"num_train_timesteps", "beta_start",        "beta_end",         "beta_schedule",
                                        "trained_betas",       "prediction_type",   "timestep_spacing", "steps_offset",
                                        "_class_name",         "_diffusers_version"};
  auto keys_of = [](const json& j) {
    std::set<std::string> keys;
    for (auto it = j.begin(); it != j.end(); ++it) keys.insert(it.key());
    return keys;
  };
  auto with_common = [&](std::set<std::string> extra) {
    extra.insert(common.begin(), common.end());
    return extra;
  };
  const json heun = make_scheduler(config_of(json::object()), "heun")->to_json();
  EXPECT_EQ(keys_of(heun), with_common({"use_karras_sigmas", "clip_sample", "clip_sample_range"}));
  // Heun alone defaults to SD's beta range.
  EXPECT_EQ(heun["beta_start"], 0.00085);
  EXPECT_EQ(heun["beta_end"], 0.012);
  EXPECT_EQ(heun["clip_sample"], false);
  const json lms = make_scheduler(config_of(json::object()), "lms")->to_json();
  EXPECT_EQ(keys_of(lms), with_common({"use_karras_sigmas"}));
  EXPECT_EQ(lms["beta_start"], 0.0001);
  const json unipc = make_scheduler(config_of(json::object()), "unipc")->to_json();
  EXPECT_EQ(keys_of(unipc),
            with_common({"solver_order", "thresholding", "dynamic_thresholding_ratio", "sample_max_value", "predict_x0",
                         "solver_type", "lower_order_final", "disable_corrector", "solver_p", "use_karras_sigmas"}));
  EXPECT_EQ(unipc["solver_type"], "bh2");
  EXPECT_EQ(unipc["predict_x0"], true);
  EXPECT_EQ(unipc["disable_corrector"], json::array());
  EXPECT_TRUE(unipc["solver_p"].is_null());
  EXPECT_EQ(unipc["timestep_spacing"], "linspace");
  // Each solver reads the other's solver_type names as its own default, as diffusers registers them.
  EXPECT_EQ(make_scheduler(config_of({{"solver_type", "midpoint"}}), "unipc")->to_json()["solver_type"], "bh2");
  EXPECT_EQ(make_scheduler(config_of({{"solver_type", "bh2"}}), "dpm")->to_json()["solver_type"], "midpoint");
  // A Karras alias saves the option it switched on.
  EXPECT_EQ(make_scheduler(config_of(sd_base()), "dpm++_karras")->to_json()["use_karras_sigmas"], true);
}

TEST(SchedulerConfigFixtures, PythonInfinityAndNaNTokens) {
  TempDir dir;
  const auto path = write_config(dir, R"({"_class_name": "DPMSolverMultistepScheduler", "_note": "NaN -Infinity",
      "beta_schedule": "scaled_linear", "lambda_min_clipped": -Infinity, "sigma_max": NaN})");
  const SchedulerConfig cfg = SchedulerConfig::load(path);
  EXPECT_TRUE(std::isinf(cfg.lambda_min_clipped) && cfg.lambda_min_clipped < 0);
  EXPECT_TRUE(std::isnan(*cfg.sigma_max));
  EXPECT_EQ(cfg.original["_note"], "NaN -Infinity");  // tokens inside strings are left alone
  auto sched = make_scheduler(cfg);
  sched->set_timesteps(10);
  EXPECT_EQ(sched->timesteps()[0].item<int64_t>(), 999);
  EXPECT_FALSE(sched->to_json().contains("lambda_min_clipped"));  // JSON cannot hold -inf; the default is -inf

  // A finite clip moves the last usable timestep (diffusers' cosine-schedule setting).
  auto clipped = make_scheduler(config_of(with(sd_base(), {{"lambda_min_clipped", -1.0}})), "dpm");
  clipped->set_timesteps(10);
  EXPECT_LT(clipped->timesteps()[0].item<int64_t>(), 999);
  EXPECT_EQ(clipped->to_json()["lambda_min_clipped"], -1.0);
}

TEST(SchedulerFactory, NamesAndAliases) {
  const std::map<std::string, std::string> expected = {{"PNDMScheduler", "PNDMScheduler"},
                                                       {"pndm", "PNDMScheduler"},
                                                       {"plms", "PNDMScheduler"},
                                                       {"ddim", "DDIMScheduler"},
                                                       {"DDPM", "DDPMScheduler"},
                                                       {"euler", "EulerDiscreteScheduler"},
                                                       {"euler_a", "EulerAncestralDiscreteScheduler"},
                                                       {"euler-ancestral", "EulerAncestralDiscreteScheduler"},
                                                       {"dpm", "DPMSolverMultistepScheduler"},
                                                       {"dpmsolver++", "DPMSolverMultistepScheduler"},
                                                       {"DPM++", "DPMSolverMultistepScheduler"},
                                                       {"DPMSolverMultistepScheduler", "DPMSolverMultistepScheduler"},
                                                       {"dpm++_2m_karras", "DPMSolverMultistepScheduler"},
                                                       {"DPM++-Karras", "DPMSolverMultistepScheduler"},
                                                       {"heun", "HeunDiscreteScheduler"},
                                                       {"lms", "LMSDiscreteScheduler"},
                                                       {"LMSDiscreteScheduler", "LMSDiscreteScheduler"},
                                                       {"unipc", "UniPCMultistepScheduler"},
                                                       {"euler_karras", "EulerDiscreteScheduler"}};
  for (const auto& [name, cls] : expected) {
    EXPECT_EQ(canonical_scheduler_name(name), cls) << name;
    EXPECT_EQ(make_scheduler(config_of(sd_base()), name)->class_name(), cls) << name;
  }
}

TEST(SchedulerErrors, UnknownNameListsTheValidOnes) {
  const std::string msg = error_of([] { make_scheduler(config_of(sd_base()), std::string("k_dpm_2")); });
  EXPECT_NE(msg.find("\"k_dpm_2\""), std::string::npos) << msg;
  for (const char* valid : {"PNDMScheduler", "DPMSolverMultistepScheduler", "euler_a", "ddim", "unipc", "heun"})
    EXPECT_NE(msg.find(valid), std::string::npos) << msg;

  TempDir dir;
  const auto path = write_config(dir, R"({"_class_name": "KDPM2DiscreteScheduler"})");
  const std::string file_msg = error_of([&] { load_scheduler(path); });
  EXPECT_NE(file_msg.find(path), std::string::npos) << file_msg;
  EXPECT_NE(file_msg.find("_class_name"), std::string::npos) << file_msg;
  EXPECT_NE(file_msg.find("KDPM2DiscreteScheduler"), std::string::npos) << file_msg;

  const std::string none = error_of([] { make_scheduler(config_of(sd_base())); });
  EXPECT_NE(none.find("_class_name"), std::string::npos) << none;
}

TEST(SchedulerErrors, StepsBelowOneOrAboveTraining) {
  for (const auto& name : {"ddpm", "ddim", "pndm", "euler", "euler_a", "dpm", "heun", "lms", "unipc"}) {
    SCOPED_TRACE(name);
    auto sched = make_scheduler(config_of(sd_base()), std::string(name));
    for (int bad : {0, -3, 1001}) {
      const std::string msg = error_of([&] { sched->set_timesteps(bad); });
      EXPECT_NE(msg.find("num_inference_steps"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
    }
    EXPECT_EQ(error_of([&] { sched->set_timesteps(1); }), "");
  }
}

TEST(SchedulerErrors, BadValuesNameTheFileAndKey) {
  TempDir dir;
  struct Bad {
    std::string json, key, detail;
  };
  const std::vector<Bad> cases = {
      {R"({"_class_name": "PNDMScheduler", "beta_schedule": "cosine"})", "beta_schedule", "cosine"},
      {R"({"_class_name": "PNDMScheduler", "num_train_timesteps": "1000"})", "num_train_timesteps", "integer"},
      {R"({"_class_name": "PNDMScheduler", "steps_offset": 1.5})", "steps_offset", "integer"},
      {R"({"_class_name": "DDIMScheduler", "clip_sample": "no"})", "clip_sample", "true or false"},
      {R"({"_class_name": "DDIMScheduler", "prediction_type": "x0"})", "prediction_type", "x0"},
      {R"({"_class_name": "DDIMScheduler", "timestep_spacing": "even"})", "timestep_spacing", "even"},
      {R"({"_class_name": "DDIMScheduler", "thresholding": true})", "thresholding", "not supported"},
      {R"({"_class_name": "DDIMScheduler", "trained_betas": [0.1, 0.2]})", "trained_betas", "2 entries"},
      {R"({"_class_name": "DDIMScheduler", "trained_betas": "x"})", "trained_betas", "list"},
      // A fuzzer's find: beyond float32, LibTorch's linspace threw its own overflow error.
      {R"({"_class_name": "PNDMScheduler", "beta_end": 5.5e51})", "beta_end", "from 0 to 1, got 5.5e+51"},
      {R"({"_class_name": "PNDMScheduler", "beta_start": -0.1})", "beta_start", "from 0 to 1, got -0.1"},
      {R"({"_class_name": "DDIMScheduler", "clip_sample_range": 1e39})", "clip_sample_range",
       "positive number within float32's range, got 1e+39"},
      {R"({"_class_name": "DDPMScheduler", "clip_sample_range": -1})", "clip_sample_range", "got -1"},
      {R"({"_class_name": "DDIMScheduler", "num_train_timesteps": 2, "trained_betas": [0.1, 2]})", "trained_betas",
       "from 0 to 1, got an entry 2"},
      {R"({"_class_name": "DDIMScheduler", "beta_schedule": "sigmoid"})", "beta_schedule", "DDIMScheduler"},
      {R"({"_class_name": "DDPMScheduler", "variance_type": "learned"})", "variance_type", "learned"},
      {R"({"_class_name": "DPMSolverMultistepScheduler", "variance_type": "learned_range"})", "variance_type",
       "must be null for Stable Diffusion (learned variances are DeepFloyd IF's)"},
      {R"({"_class_name": "PNDMScheduler", "prediction_type": "sample"})", "prediction_type", "sample"},
      {R"({"_class_name": "EulerAncestralDiscreteScheduler", "prediction_type": "sample"})", "prediction_type",
       "sample"},
      {R"({"_class_name": "EulerDiscreteScheduler", "interpolation_type": "cubic"})", "interpolation_type", "cubic"},
      {R"({"_class_name": "EulerDiscreteScheduler", "rescale_betas_zero_snr": true})", "rescale_betas_zero_snr",
       "Euler"},
      {R"({"_class_name": "UniPCMultistepScheduler", "solver_type": "rk4"})", "solver_type", "bh1 or bh2"},
      {R"({"_class_name": "UniPCMultistepScheduler", "solver_p": {"x": 1}})", "solver_p", "null"},
      {R"({"_class_name": "UniPCMultistepScheduler", "solver_order": 0})", "solver_order", ">= 1"},
      {R"({"_class_name": "UniPCMultistepScheduler", "disable_corrector": "all"})", "disable_corrector", "list"},
      {R"({"_class_name": "HeunDiscreteScheduler", "rescale_betas_zero_snr": true})", "rescale_betas_zero_snr",
       "HeunDiscreteScheduler"},
      {R"({"_class_name": "DPMSolverMultistepScheduler", "algorithm_type": "unipc"})", "algorithm_type", "unipc"},
      {R"({"_class_name": "DPMSolverMultistepScheduler", "solver_type": "rk4"})", "solver_type", "rk4"},
      {R"({"_class_name": "DPMSolverMultistepScheduler", "solver_order": 4})", "solver_order", "4"},
      {R"({"_class_name": "DPMSolverMultistepScheduler", "lambda_min_clipped": "low"})", "lambda_min_clipped",
       "number"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.json);
    const auto path = write_config(dir, c.json);
    const std::string msg = error_of([&] { load_scheduler(path); });
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("'" + c.key + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.detail), std::string::npos) << msg;
  }
  EXPECT_NE(error_of([&] { load_scheduler(dir.path() / "missing.json"); }).find("missing file"), std::string::npos);
  const auto broken = write_config(dir, "{\"beta_start\": ");
  EXPECT_NE(error_of([&] { load_scheduler(broken); }).find("invalid JSON"), std::string::npos);
}

TEST(SchedulerNoise, GeneratorDrawsMatchExplicitDraws) {
  // EulerAncestral with a seeded generator == the same run fed torch.randn draws from an equally seeded one.
  const at::Tensor x0 = at::randn({1, 4, 8, 8});
  auto run = [&](bool use_generator) {
    auto sched = make_scheduler(config_of(sd_base()), std::string("euler_a"));
    sched->set_timesteps(5);
    at::Tensor x = x0 * sched->init_noise_sigma();
    at::Generator gen = at::detail::createCPUGenerator(1234);
    at::Generator replay = at::detail::createCPUGenerator(1234);
    for (int64_t i = 0; i < sched->timesteps().size(0); ++i) {
      const at::Tensor t = sched->timesteps()[i];
      const at::Tensor out = 0.1 * sched->scale_model_input(x, t);
      x = use_generator ? sched->step(out, t, x, gen) : sched->step(out, t, x, at::randn(x.sizes(), replay));
    }
    return x;
  };
  const at::Tensor a = run(true), b = run(false);
  EXPECT_TRUE(at::equal(a, b));

  // EulerDiscrete draws (and discards) one tensor per step like diffusers, so the generator ends up where
  // diffusers leaves it.
  auto euler = make_scheduler(config_of(sd_base()), std::string("euler"));
  euler->set_timesteps(3);
  at::Generator gen = at::detail::createCPUGenerator(7);
  at::Generator ref = at::detail::createCPUGenerator(7);
  const at::Tensor x = at::randn({1, 4, 8, 8});
  euler->step(0.1 * x, euler->timesteps()[0], x, gen);
  at::randn(x.sizes(), ref);
  EXPECT_TRUE(at::equal(at::randn({3}, gen), at::randn({3}, ref)));

  auto ddpm = make_scheduler(config_of(sd_base()), std::string("ddpm"));
  ddpm->set_timesteps(10);
  const std::string msg = error_of([&] { ddpm->step(x, ddpm->timesteps()[0], x, at::zeros({1, 4, 4, 4})); });
  EXPECT_NE(msg.find("shape"), std::string::npos) << msg;
}

// With the exact epsilon of x_t = sqrt(acp) x0 + sqrt(1 - acp) eps, every deterministic sampler lands on the
// forward-process value of its final timestep: that checks the table walk and each update form without goldens.
struct PerfectModelCase {
  std::string scheduler;
  json config;
};

void PrintTo(const PerfectModelCase& c, std::ostream* os) { *os << c.scheduler << " " << c.config.dump(); }

class PerfectEpsilonModel : public ::testing::TestWithParam<PerfectModelCase> {};

TEST_P(PerfectEpsilonModel, ReachesTheForwardProcessValue) {
  const auto& p = GetParam();
  for (int n : {4, 10, 20}) {
    SCOPED_TRACE(n);
    auto sched = make_scheduler(config_of(with(sd_base(), p.config)), p.scheduler);
    sched->set_timesteps(n);
    const at::Tensor x0 = at::randn({1, 4, 8, 8}, at::kDouble).to(at::kFloat);
    const at::Tensor eps = at::randn({1, 4, 8, 8});
    const at::Tensor& acp = sched->alphas_cumprod();
    const bool sigma_space = sched->sigmas().defined() && sched->init_noise_sigma() > 1.0;  // Euler: x0 + sigma*eps
    at::Tensor x;
    if (sigma_space) {
      x = x0 + sched->sigmas()[0] * eps;
    } else {
      const at::Tensor a = acp[sched->timesteps()[0].item<int64_t>()];
      x = a.sqrt() * x0 + (1 - a).sqrt() * eps;
    }
    const std::string prediction = p.config.value("prediction_type", "epsilon");
    const bool v = prediction == "v_prediction";
    for (int64_t i = 0; i < sched->timesteps().size(0); ++i) {
      const at::Tensor t = sched->timesteps()[i];
      const at::Tensor inp = sched->scale_model_input(x, t);
      at::Tensor out = prediction == "sample" ? x0 : eps;
      if (v) {
        // v = alpha * eps - sigma * x0 at this step's noise level (VP parameterisation).
        at::Tensor alpha, sigma;
        if (sigma_space) {
          const at::Tensor s = sched->sigmas()[i];
          alpha = 1 / (s * s + 1).sqrt();
          sigma = s * alpha;
        } else {
          const at::Tensor a = acp[t.item<int64_t>()];
          alpha = a.sqrt();
          sigma = (1 - a).sqrt();
        }
        out = alpha * eps - sigma * x0;
      }
      x = sched->step(out, t, x);
      (void)inp;
    }
    at::Tensor expected;
    if (sigma_space) {
      expected = x0;
    } else if (sched->sigmas().defined()) {
      // DPM-Solver ends at sigma(t = 0).
      const at::Tensor s = sched->sigmas()[-1];
      const at::Tensor alpha = 1 / (s * s + 1).sqrt();
      expected = alpha * x0 + s * alpha * eps;
    } else {
      expected = acp[0].sqrt() * x0 + (1 - acp[0]).sqrt() * eps;  // set_alpha_to_one false
    }
    EXPECT_TRUE(close_rel_max(x, expected, 1e-4));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Samplers, PerfectEpsilonModel,
    ::testing::Values(
        PerfectModelCase{"ddim", json::object()}, PerfectModelCase{"ddim", {{"prediction_type", "v_prediction"}}},
        PerfectModelCase{"ddim", {{"timestep_spacing", "trailing"}}}, PerfectModelCase{"pndm", json::object()},
        PerfectModelCase{"pndm", {{"skip_prk_steps", false}}},
        // (diffusers' PNDM always steps t -> t - T // n, so only spacings with that stride are exact.)
        PerfectModelCase{"pndm", {{"skip_prk_steps", false}, {"timestep_spacing", "trailing"}}},
        PerfectModelCase{"euler", json::object()}, PerfectModelCase{"euler", {{"prediction_type", "v_prediction"}}},
        PerfectModelCase{"euler", {{"timestep_spacing", "leading"}}}, PerfectModelCase{"dpm", json::object()},
        PerfectModelCase{"dpm", {{"prediction_type", "v_prediction"}}}, PerfectModelCase{"dpm", {{"solver_order", 3}}},
        PerfectModelCase{"dpm", {{"solver_order", 1}}}, PerfectModelCase{"dpm", {{"solver_type", "heun"}}},
        PerfectModelCase{"dpm", {{"algorithm_type", "dpmsolver"}}},
        PerfectModelCase{"dpm", {{"algorithm_type", "dpmsolver"}, {"solver_order", 3}}},
        PerfectModelCase{"dpm", {{"algorithm_type", "dpmsolver"}, {"solver_type", "heun"}}},
        PerfectModelCase{"dpm", {{"prediction_type", "sample"}}},
        PerfectModelCase{"dpm", {{"use_karras_sigmas", true}}},
        PerfectModelCase{"euler", {{"use_karras_sigmas", true}}}, PerfectModelCase{"heun", json::object()},
        PerfectModelCase{"heun", {{"prediction_type", "v_prediction"}}},
        PerfectModelCase{"heun", {{"use_karras_sigmas", true}}}, PerfectModelCase{"lms", json::object()},
        PerfectModelCase{"lms", {{"prediction_type", "v_prediction"}}},
        PerfectModelCase{"lms", {{"use_karras_sigmas", true}}}, PerfectModelCase{"unipc", json::object()},
        PerfectModelCase{"unipc", {{"prediction_type", "v_prediction"}}},
        PerfectModelCase{"unipc", {{"use_karras_sigmas", true}}}, PerfectModelCase{"unipc", {{"solver_order", 3}}},
        PerfectModelCase{"unipc", {{"solver_type", "bh1"}}}, PerfectModelCase{"unipc", {{"predict_x0", false}}}));

TEST(SchedulerTables, PrkWarmupTable) {
  // diffusers' PRK table for n = 10, leading + offset 1: the last four base steps with half-step midpoints,
  // each midpoint evaluated twice, then PLMS over the remaining base steps.
  auto sched = make_scheduler(config_of(with(sd_base(), {{"skip_prk_steps", false}})), std::string("pndm"));
  sched->set_timesteps(10);
  const std::vector<int64_t> expected = {901, 851, 851, 801, 801, 751, 751, 701, 701, 651,
                                         651, 601, 601, 501, 401, 301, 201, 101, 1};
  EXPECT_TRUE(at::equal(sched->timesteps(), at::tensor(expected, at::kLong))) << sched->timesteps();
}

TEST(SchedulerTables, EulerLogLinearAndContinuousTimesteps) {
  auto reference = make_scheduler(config_of(sd_base()), std::string("euler"));
  const at::Tensor acp = reference->alphas_cumprod();
  const double sigma_max = std::sqrt((1 - acp[-1].item<double>()) / acp[-1].item<double>());
  const double sigma_min = std::sqrt((1 - acp[0].item<double>()) / acp[0].item<double>());

  // log_linear: n + 1 log-spaced sigmas from sigma_max to sigma_min, then the final 0 (as diffusers 0.24).
  auto log_linear = make_scheduler(config_of(with(sd_base(), {{"interpolation_type", "log_linear"}})), "euler");
  log_linear->set_timesteps(8);
  const at::Tensor s = log_linear->sigmas().to(at::kDouble);
  ASSERT_EQ(s.size(0), 10);
  EXPECT_NEAR(s[0].item<double>(), sigma_max, 1e-5 * sigma_max);
  EXPECT_NEAR(s[8].item<double>(), sigma_min, 1e-5);
  EXPECT_EQ(s[9].item<double>(), 0.0);
  const at::Tensor log_steps = s.slice(0, 0, 9).log().diff();
  EXPECT_TRUE(
      close_rel_max(log_steps, at::full({8}, (std::log(sigma_min) - std::log(sigma_max)) / 8, at::kDouble), 1e-4));

  // timestep_type continuous with v_prediction: the UNet gets 0.25 * log(sigma).
  auto continuous = make_scheduler(
      config_of(with(sd_base(), {{"timestep_type", "continuous"}, {"prediction_type", "v_prediction"}})), "euler");
  continuous->set_timesteps(8);
  EXPECT_EQ(continuous->timesteps().scalar_type(), at::kFloat);
  EXPECT_TRUE(close_rel_max(continuous->timesteps(), continuous->sigmas().slice(0, 0, 8).log() * 0.25, 1e-6));
  // EulerAncestral has neither option in diffusers 0.24 and ignores them.
  auto ancestral = make_scheduler(config_of(with(sd_base(), {{"interpolation_type", "log_linear"}})), "euler_a");
  ancestral->set_timesteps(8);
  EXPECT_EQ(ancestral->sigmas().size(0), 9);
}

TEST(SchedulerTables, TrainedBetasAndZeroSnrRescale) {
  auto reference = make_scheduler(config_of(sd_base()), std::string("ddim"));
  const at::Tensor betas = reference->betas().to(at::kDouble);
  const std::vector<double> list(betas.data_ptr<double>(), betas.data_ptr<double>() + betas.numel());
  auto trained = make_scheduler(config_of(with(sd_base(), {{"trained_betas", list}})), std::string("ddim"));
  EXPECT_TRUE(at::equal(trained->alphas_cumprod(), reference->alphas_cumprod()));

  // Zero terminal SNR: the last alpha_cumprod becomes 0, the first keeps its value.
  for (const auto& name : {"ddim", "ddpm"}) {
    auto rescaled = make_scheduler(config_of(with(sd_base(), {{"rescale_betas_zero_snr", true}})), std::string(name));
    const at::Tensor acp = rescaled->alphas_cumprod();
    EXPECT_EQ(acp[-1].item<float>(), 0.0f);
    EXPECT_NEAR(acp[0].item<double>(), reference->alphas_cumprod()[0].item<double>(), 1e-6);
    EXPECT_TRUE((acp.slice(0, 1) <= acp.slice(0, 0, -1)).all().item<bool>());
  }
}

TEST(SchedulerTables, DdpmTrainingHelpersBroadcastPerSample) {
  DDPMScheduler sched(config_of(sd_base()));
  const at::Tensor x0 = at::randn({3, 4, 2, 2}), noise = at::randn({3, 4, 2, 2});
  const at::Tensor t = at::tensor({0, 500, 999}, at::kLong);
  const at::Tensor noisy = sched.add_noise(x0, noise, t);
  const at::Tensor v = sched.get_velocity(x0, noise, t);
  for (int64_t i = 0; i < 3; ++i) {
    const at::Tensor a = sched.alphas_cumprod()[t[i].item<int64_t>()];
    EXPECT_TRUE(close_rel_max(noisy[i], a.sqrt() * x0[i] + (1 - a).sqrt() * noise[i], 1e-6));
    EXPECT_TRUE(close_rel_max(v[i], a.sqrt() * noise[i] - (1 - a).sqrt() * x0[i], 1e-6));
  }
  // bf16 training computes in the samples' dtype, as diffusers does.
  EXPECT_EQ(sched.add_noise(x0.to(at::kBFloat16), noise.to(at::kBFloat16), t).scalar_type(), at::kBFloat16);
}

}  // namespace
}  // namespace sd::schedulers
