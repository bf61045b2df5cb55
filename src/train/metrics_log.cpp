#include "train/metrics_log.h"

#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"

namespace sd::train {

namespace {

// The lines of `text` whose "step" is at most `last_step` (unreadable lines are dropped too).
std::string lines_up_to(const std::string& text, int64_t last_step) {
  std::istringstream in(text);
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_object() && record.value("step", int64_t{-1}) >= 0 && record.value("step", int64_t{0}) <= last_step)
      kept += line + "\n";
  }
  return kept;
}

}  // namespace

MetricsLog::MetricsLog(const std::filesystem::path& path, int64_t resumed_step) {
  std::filesystem::create_directories(path.parent_path());
  if (std::filesystem::exists(path)) io::write_text_file(path, lines_up_to(io::read_text_file(path), resumed_step));
  out_ = std::make_unique<io::FileWriter>(path, path, /*append=*/true);
}

void MetricsLog::write(const nlohmann::json& record) {
  if (out_) out_->write(record.dump() + "\n");
}

}  // namespace sd::train
