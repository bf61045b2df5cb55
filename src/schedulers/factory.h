// Builds a scheduler from a diffusers scheduler config, by the config's `_class_name` or by a name the user
// gives (diffusers' class names or short aliases: pndm, ddim, ddpm, euler, euler_a, dpm++, heun, lms, unipc, ...,
// and the "Karras" spellings such as dpm++_karras that also switch on use_karras_sigmas).
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "schedulers/scheduler.h"

namespace sd::schedulers {

// diffusers' class name for a class name or alias (case-insensitive); unknown -> sd::Error listing the names.
std::string canonical_scheduler_name(const std::string& name);
// Every accepted name, class names first.
std::vector<std::string> scheduler_names();
// Whether diffusers 0.24's class has the use_karras_sigmas option (DPM-Solver, UniPC, Euler, Heun, LMS).
bool has_karras_sigmas(const std::string& class_name);

// `name` overrides the config's _class_name, like diffusers' OtherScheduler.from_config(pipe.scheduler.config):
// keys present in the file still win over the new class's defaults. A Karras alias sets use_karras_sigmas.
std::unique_ptr<Scheduler> make_scheduler(const SchedulerConfig& config,
                                          const std::optional<std::string>& name = std::nullopt);
// Reads scheduler/scheduler_config.json and builds it.
std::unique_ptr<Scheduler> load_scheduler(const std::filesystem::path& config_json,
                                          const std::optional<std::string>& name = std::nullopt);

}  // namespace sd::schedulers
