// Ranks that disagree on what the run is (model, data, resolution, learning rate, batch, steps, resume point...)
// must not train on: they would produce a silently wrong model, or abort inside Gloo when a collective's sizes
// differ. At start-up every rank shares the settings that define the run, and any difference stops every rank
// with the same one line, naming the setting and the values.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "dist/communicator.h"

namespace sd::train {

// Throws sd::Error on every rank when some rank's `settings` differ from rank 0's: "ranks disagree on <what>:
// <key> is <v0> on rank 0 but <v1> on rank <r>". Only equal-sized collectives are issued, whatever the settings.
void check_ranks_agree(dist::Communicator& comm, const nlohmann::json& settings, const std::string& what);

// The first setting (a flattened key like "flags.--learning_rate") whose values differ, with both values as text
// ("(not set)" where one side lacks it); empty when a and b are equal. Values whose whole text is a number are
// compared as numbers ("1e-4" and "0.0001" agree).
struct SettingDifference {
  std::string key, a, b;
};
SettingDifference first_difference(const nlohmann::json& a, const nlohmann::json& b);

}  // namespace sd::train
