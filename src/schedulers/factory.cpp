#include "schedulers/factory.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/text.h"
#include "schedulers/ddim.h"
#include "schedulers/ddpm.h"
#include "schedulers/dpm_solver.h"
#include "schedulers/euler.h"
#include "schedulers/heun.h"
#include "schedulers/lms.h"
#include "schedulers/pndm.h"
#include "schedulers/unipc.h"

namespace sd::schedulers {

namespace {

struct SchedulerName {
  std::string name;
  std::string class_name;
  bool karras = false;  // the name also asks for use_karras_sigmas (A1111's "DPM++ 2M Karras" and the like)
};

const std::vector<SchedulerName>& name_table() {
  static const std::vector<SchedulerName> table = {
      {"DDPMScheduler", "DDPMScheduler"},
      {"DDIMScheduler", "DDIMScheduler"},
      {"PNDMScheduler", "PNDMScheduler"},
      {"EulerDiscreteScheduler", "EulerDiscreteScheduler"},
      {"EulerAncestralDiscreteScheduler", "EulerAncestralDiscreteScheduler"},
      {"DPMSolverMultistepScheduler", "DPMSolverMultistepScheduler"},
      {"HeunDiscreteScheduler", "HeunDiscreteScheduler"},
      {"LMSDiscreteScheduler", "LMSDiscreteScheduler"},
      {"UniPCMultistepScheduler", "UniPCMultistepScheduler"},
      {"ddpm", "DDPMScheduler"},
      {"ddim", "DDIMScheduler"},
      {"pndm", "PNDMScheduler"},
      {"plms", "PNDMScheduler"},
      {"euler", "EulerDiscreteScheduler"},
      {"euler_karras", "EulerDiscreteScheduler", true},
      {"euler_a", "EulerAncestralDiscreteScheduler"},
      {"euler_ancestral", "EulerAncestralDiscreteScheduler"},
      {"dpm", "DPMSolverMultistepScheduler"},
      {"dpmsolver", "DPMSolverMultistepScheduler"},
      {"dpmsolver++", "DPMSolverMultistepScheduler"},
      {"dpm++", "DPMSolverMultistepScheduler"},
      {"dpm++_2m", "DPMSolverMultistepScheduler"},
      {"dpmsolver_multistep", "DPMSolverMultistepScheduler"},
      {"dpm++_karras", "DPMSolverMultistepScheduler", true},
      {"dpm++_2m_karras", "DPMSolverMultistepScheduler", true},
      {"heun", "HeunDiscreteScheduler"},
      {"heun_karras", "HeunDiscreteScheduler", true},
      {"lms", "LMSDiscreteScheduler"},
      {"lms_karras", "LMSDiscreteScheduler", true},
      {"unipc", "UniPCMultistepScheduler"},
      {"unipc_karras", "UniPCMultistepScheduler", true},
  };
  return table;
}

// The table entry for a class name or alias; '-' and '_' are interchangeable (euler-a, dpm-solver++ spellings).
const SchedulerName& lookup(const std::string& name) {
  std::string key = lowercase(name);
  std::replace(key.begin(), key.end(), '-', '_');
  for (const SchedulerName& entry : name_table())
    if (lowercase(entry.name) == key) return entry;
  std::string valid;
  for (const auto& n : scheduler_names()) valid += (valid.empty() ? "" : ", ") + n;
  fail("unknown scheduler \"{}\"; valid names: {}", name, valid);
}

}  // namespace

std::vector<std::string> scheduler_names() {
  std::vector<std::string> names;
  for (const SchedulerName& entry : name_table()) names.push_back(entry.name);
  return names;
}

std::string canonical_scheduler_name(const std::string& name) { return lookup(name).class_name; }

bool has_karras_sigmas(const std::string& class_name) {
  for (const char* cls : {"DPMSolverMultistepScheduler", "UniPCMultistepScheduler", "EulerDiscreteScheduler",
                          "HeunDiscreteScheduler", "LMSDiscreteScheduler"})
    if (class_name == cls) return true;
  return false;
}

std::unique_ptr<Scheduler> make_scheduler(const SchedulerConfig& given, const std::optional<std::string>& name) {
  SchedulerConfig config = given;
  std::string cls;
  if (name) {
    const SchedulerName& entry = lookup(*name);
    cls = entry.class_name;
    if (entry.karras) config.use_karras_sigmas = true;
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
  if (cls == "HeunDiscreteScheduler") return std::make_unique<HeunDiscreteScheduler>(config);
  if (cls == "LMSDiscreteScheduler") return std::make_unique<LMSDiscreteScheduler>(config);
  if (cls == "UniPCMultistepScheduler") return std::make_unique<UniPCMultistepScheduler>(config);
  return std::make_unique<DPMSolverMultistepScheduler>(config);
}

std::unique_ptr<Scheduler> load_scheduler(const std::filesystem::path& config_json,
                                          const std::optional<std::string>& name) {
  return make_scheduler(SchedulerConfig::load(config_json), name);
}

}  // namespace sd::schedulers
