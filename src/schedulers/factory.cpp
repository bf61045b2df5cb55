#include "schedulers/factory.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "core/error.h"
#include "schedulers/ddim.h"
#include "schedulers/ddpm.h"
#include "schedulers/dpm_solver.h"
#include "schedulers/euler.h"
#include "schedulers/pndm.h"

namespace sd::schedulers {

namespace {

// {accepted name, diffusers class name}
const std::vector<std::pair<std::string, std::string>>& name_table() {
  static const std::vector<std::pair<std::string, std::string>> table = {
      {"DDPMScheduler", "DDPMScheduler"},
      {"DDIMScheduler", "DDIMScheduler"},
      {"PNDMScheduler", "PNDMScheduler"},
      {"EulerDiscreteScheduler", "EulerDiscreteScheduler"},
      {"EulerAncestralDiscreteScheduler", "EulerAncestralDiscreteScheduler"},
      {"DPMSolverMultistepScheduler", "DPMSolverMultistepScheduler"},
      {"ddpm", "DDPMScheduler"},
      {"ddim", "DDIMScheduler"},
      {"pndm", "PNDMScheduler"},
      {"plms", "PNDMScheduler"},
      {"euler", "EulerDiscreteScheduler"},
      {"euler_a", "EulerAncestralDiscreteScheduler"},
      {"euler_ancestral", "EulerAncestralDiscreteScheduler"},
      {"dpm", "DPMSolverMultistepScheduler"},
      {"dpmsolver", "DPMSolverMultistepScheduler"},
      {"dpmsolver++", "DPMSolverMultistepScheduler"},
      {"dpm++", "DPMSolverMultistepScheduler"},
      {"dpmsolver_multistep", "DPMSolverMultistepScheduler"},
  };
  return table;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return s;
}

}  // namespace

std::vector<std::string> scheduler_names() {
  std::vector<std::string> names;
  for (const auto& [name, cls] : name_table()) names.push_back(name);
  return names;
}

std::string canonical_scheduler_name(const std::string& name) {
  // '-' and '_' are interchangeable in aliases (euler-a, dpm-solver++ style spellings).
  std::string key = lower(name);
  std::replace(key.begin(), key.end(), '-', '_');
  for (const auto& [alias, cls] : name_table())
    if (lower(alias) == key) return cls;
  std::string valid;
  for (const auto& n : scheduler_names()) valid += (valid.empty() ? "" : ", ") + n;
  fail("unknown scheduler \"{}\"; valid names: {}", name, valid);
}

std::unique_ptr<Scheduler> make_scheduler(const SchedulerConfig& config, const std::optional<std::string>& name) {
  std::string cls;
  if (name) {
    cls = canonical_scheduler_name(*name);
  } else {
    SD_CHECK(!config.class_name.empty(), "{}: no _class_name; name the scheduler to use", config.source);
    try {
      cls = canonical_scheduler_name(config.class_name);
    } catch (const Error& e) {
      fail("{}: key '_class_name': {}", config.source, e.what());
    }
  }
  if (cls == "DDPMScheduler") return std::make_unique<DDPMScheduler>(config);
  if (cls == "DDIMScheduler") return std::make_unique<DDIMScheduler>(config);
  if (cls == "PNDMScheduler") return std::make_unique<PNDMScheduler>(config);
  if (cls == "EulerDiscreteScheduler") return std::make_unique<EulerDiscreteScheduler>(config);
  if (cls == "EulerAncestralDiscreteScheduler") return std::make_unique<EulerAncestralDiscreteScheduler>(config);
  return std::make_unique<DPMSolverMultistepScheduler>(config);
}

std::unique_ptr<Scheduler> load_scheduler(const std::filesystem::path& config_json,
                                          const std::optional<std::string>& name) {
  return make_scheduler(SchedulerConfig::load(config_json), name);
}

}  // namespace sd::schedulers
