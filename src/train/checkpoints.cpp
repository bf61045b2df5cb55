#include "train/checkpoints.h"

#include <unistd.h>

#include <algorithm>
#include <regex>

#include "core/error.h"

namespace sd::train {

namespace fs = std::filesystem;

namespace {
const std::regex kCheckpointName("checkpoint-([0-9]+)");
}

int64_t checkpoint_step(const fs::path& checkpoint) {
  std::smatch m;
  const std::string name = checkpoint.filename().string();
  SD_CHECK(std::regex_match(name, m, kCheckpointName), "{}: not a checkpoint-N folder", checkpoint.string());
  return std::stoll(m[1].str());
}

std::vector<fs::path> list_checkpoints(const fs::path& output_dir) {
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

std::optional<fs::path> resolve_checkpoint(const fs::path& output_dir, const std::string& flag) {
  if (flag.empty()) return std::nullopt;
  if (flag == "latest") {
    auto all = list_checkpoints(output_dir);
    if (all.empty()) return std::nullopt;
    return all.back();
  }
  // As the reference does, a bare name is looked up in the output directory.
  fs::path path = fs::path(flag).has_parent_path() ? fs::path(flag) : output_dir / flag;
  SD_CHECK(fs::is_directory(path), "--resume_from_checkpoint {}: no such checkpoint folder", path.string());
  checkpoint_step(path);
  return path;
}

void enforce_total_limit(const fs::path& output_dir, std::optional<int> limit) {
  if (!limit) return;
  auto all = list_checkpoints(output_dir);
  const int64_t keep = std::max(0, *limit - 1);
  for (int64_t i = 0; i + keep < static_cast<int64_t>(all.size()); ++i) fs::remove_all(all[i]);
}

void write_directory_atomically(const fs::path& dir, const std::function<void(const fs::path&)>& fill) {
  fs::path tmp = dir;
  tmp += fmt::format(".tmp{}", getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    fill(tmp);
    fs::path old = dir;
    old += ".old";
    if (fs::exists(dir)) fs::rename(dir, old);
    fs::rename(tmp, dir);
    fs::remove_all(old);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
}

}  // namespace sd::train
