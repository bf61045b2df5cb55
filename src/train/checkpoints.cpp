#include "train/checkpoints.h"

#include <algorithm>
#include <regex>

#include "core/error.h"
#include "core/log.h"
#include "io/atomic_file.h"
#include "io/json_config.h"

namespace sd::train {

namespace fs = std::filesystem;

namespace {
const std::regex kCheckpointName("checkpoint-([0-9]+)");
const std::regex kPartialName("checkpoint-([0-9]+)\\.partial");

bool is_whole(const fs::path& dir) { return fs::is_regular_file(dir / kManifestName); }

// checkpoint-N folders, whole or not, sorted by N.
std::vector<fs::path> checkpoint_folders(const fs::path& output_dir) {
  std::vector<fs::path> out;
  if (!fs::is_directory(output_dir)) return out;
  for (const auto& entry : fs::directory_iterator(output_dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, kCheckpointName)) out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end(),
            [](const fs::path& a, const fs::path& b) { return checkpoint_step(a) < checkpoint_step(b); });
  return out;
}
}  // namespace

int64_t checkpoint_step(const fs::path& checkpoint) {
  std::smatch m;
  const std::string name = checkpoint.filename().string();
  SD_CHECK(std::regex_match(name, m, kCheckpointName), "{}: not a checkpoint-N folder", checkpoint.string());
  return std::stoll(m[1].str());
}

std::vector<fs::path> list_checkpoints(const fs::path& output_dir) {
  std::vector<fs::path> out;
  for (const auto& dir : checkpoint_folders(output_dir))
    if (is_whole(dir)) out.push_back(dir);
  return out;
}

std::optional<fs::path> resolve_checkpoint(const fs::path& output_dir, const std::string& flag) {
  if (flag.empty()) return std::nullopt;
  if (flag == "latest") {
    for (const auto& dir : checkpoint_folders(output_dir))
      if (!is_whole(dir)) log::warn("{}: incomplete checkpoint (no {}), not resumed from", dir.string(), kManifestName);
    auto whole = list_checkpoints(output_dir);
    if (whole.empty()) return std::nullopt;
    return whole.back();
  }
  // As the reference does, a bare name is looked up in the output directory.
  fs::path path = fs::path(flag).has_parent_path() ? fs::path(flag) : output_dir / flag;
  SD_CHECK(fs::is_directory(path), "--resume_from_checkpoint {}: no such checkpoint folder", path.string());
  checkpoint_step(path);
  SD_CHECK(is_whole(path), "--resume_from_checkpoint {}: incomplete checkpoint (no {}); it was not fully written",
           path.string(), kManifestName);
  return path;
}

nlohmann::json read_manifest(const fs::path& checkpoint) {
  const io::JsonConfig manifest = io::JsonConfig::load(checkpoint / kManifestName);
  SD_CHECK(manifest.get<std::string>("format", "") == kCheckpointFormat,
           "{}: not an sdtrain checkpoint manifest (format '{}', expected '{}')", (checkpoint / kManifestName).string(),
           manifest.get<std::string>("format", ""), kCheckpointFormat);
  for (const char* key : {"task", "identity", "step", "trained"})
    SD_CHECK(manifest.raw().contains(key), "{}: missing key '{}'", (checkpoint / kManifestName).string(), key);
  return manifest.raw();
}

fs::path partial_checkpoint_path(const fs::path& checkpoint) {
  fs::path partial = checkpoint;
  partial += ".partial";
  return partial;
}

void discard_partial_checkpoints(const fs::path& output_dir) {
  if (!fs::is_directory(output_dir)) return;
  for (const auto& entry : fs::directory_iterator(output_dir))
    if (entry.is_directory() && std::regex_match(entry.path().filename().string(), kPartialName))
      fs::remove_all(entry.path());
}

void publish_checkpoint(const fs::path& partial, const fs::path& checkpoint) {
  io::replace_directory(partial, checkpoint);
}

bool is_checkpoint_name(const std::string& name) { return std::regex_match(name, kCheckpointName); }

void remove_old_checkpoints(const fs::path& output_dir, std::optional<int> limit) {
  if (!limit) return;
  const auto whole = list_checkpoints(output_dir);
  const int64_t keep = std::max(1, *limit);
  for (int64_t i = 0; i + keep < static_cast<int64_t>(whole.size()); ++i) fs::remove_all(whole[i]);
}

}  // namespace sd::train
