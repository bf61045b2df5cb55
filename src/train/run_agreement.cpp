#include "train/run_agreement.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>

#include "core/error.h"

namespace sd::train {

using nlohmann::json;

namespace {

// "a.b.c" -> value, for every leaf of a JSON object (arrays are leaves).
void flatten(const json& j, const std::string& prefix, std::map<std::string, json>& out) {
  if (!j.is_object()) {
    out[prefix] = j;
    return;
  }
  for (const auto& [key, value] : j.items()) flatten(value, prefix.empty() ? key : prefix + "." + key, out);
}

// A setting's value as a number, if all of its text is one: ranks launched with --learning_rate 1e-4 and 0.0001 agree.
std::optional<double> as_number(const json& value) {
  if (value.is_number()) return value.get<double>();
  if (!value.is_string()) return std::nullopt;
  const std::string& text = value.get_ref<const std::string&>();
  char* end = nullptr;
  const double number = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0') return std::nullopt;
  return number;
}

bool same_value(const json& a, const json& b) {
  if (a == b) return true;
  const std::optional<double> x = as_number(a), y = as_number(b);
  return x && y && *x == *y;
}

// Every rank's serialized settings: the lengths first, then each rank's bytes broadcast from it, so every
// collective has the same size on every rank.
std::vector<std::string> gather_strings(dist::Communicator& comm, const std::string& mine) {
  const std::vector<int64_t> lengths = comm.all_gather({static_cast<int64_t>(mine.size())});
  std::vector<std::string> all;
  for (int r = 0; r < comm.world_size(); ++r) {
    at::Tensor bytes = at::zeros({lengths[r]}, at::kByte);
    if (r == comm.rank()) std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
    comm.broadcast(bytes, r);
    all.emplace_back(reinterpret_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(lengths[r]));
  }
  return all;
}

}  // namespace

SettingDifference first_difference(const json& a, const json& b) {
  std::map<std::string, json> fa, fb;
  flatten(a, "", fa);
  flatten(b, "", fb);
  const std::string missing = "(not set)";
  for (const auto& [key, value] : fa) {
    const auto other = fb.find(key);
    if (other == fb.end()) return {key, value.dump(), missing};
    if (!same_value(value, other->second)) return {key, value.dump(), other->second.dump()};
  }
  for (const auto& [key, value] : fb)
    if (!fa.count(key)) return {key, missing, value.dump()};
  return {};
}

void check_ranks_agree(dist::Communicator& comm, const json& settings, const std::string& what) {
  if (comm.world_size() == 1) return;
  const std::vector<std::string> all = gather_strings(comm, settings.dump());
  const json reference = json::parse(all[0]);
  for (int r = 1; r < comm.world_size(); ++r) {
    const SettingDifference d = first_difference(reference, json::parse(all[r]));
    if (!d.key.empty())
      fail("ranks disagree on {}: {} is {} on rank 0 but {} on rank {} (every rank must run the same command)", what,
           d.key, d.a, d.b, r);
  }
}

}  // namespace sd::train
