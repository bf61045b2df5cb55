// Training metrics as JSON lines (one object per optimizer step), appended and flushed as they come so a crash
// loses at most the line being written. Readable by anything: jq, pandas, a spreadsheet.
#pragma once
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace sd::train {

class MetricsLog {
 public:
  MetricsLog() = default;
  // Opens `path` for appending (a resumed run continues the same file).
  explicit MetricsLog(const std::filesystem::path& path);
  void write(const nlohmann::json& record);
  bool is_open() const { return out_.is_open(); }

 private:
  std::ofstream out_;
};

}  // namespace sd::train
