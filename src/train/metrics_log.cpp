#include "train/metrics_log.h"

#include "core/error.h"

namespace sd::train {

MetricsLog::MetricsLog(const std::filesystem::path& path) {
  std::filesystem::create_directories(path.parent_path());
  out_.open(path, std::ios::app);
  SD_CHECK(out_.is_open(), "{}: cannot open the metrics log for writing", path.string());
}

void MetricsLog::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  out_ << record.dump() << '\n';
  out_.flush();
}

}  // namespace sd::train
