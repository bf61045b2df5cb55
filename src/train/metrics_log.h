// Training metrics as JSON lines (one object per optimizer step), appended and flushed as they come so a crash
// loses at most the line being written. Readable by anything: jq, pandas, a spreadsheet, `sdtrain report`.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"

namespace sd::train {

class MetricsLog {
 public:
  MetricsLog() = default;
  // Opens `path` for appending. A run resumed at step `resumed_step` first drops the lines of later steps, which
  // belong to the interrupted run beyond its last checkpoint and are about to be trained again.
  MetricsLog(const std::filesystem::path& path, int64_t resumed_step);
  void write(const nlohmann::json& record);
  bool is_open() const { return out_ != nullptr; }

 private:
  std::unique_ptr<io::FileWriter> out_;  // unbuffered: each line reaches the file as it is written
};

}  // namespace sd::train
