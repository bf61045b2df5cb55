// Where the training loop's metrics go, as --report_to chooses (diffusers' flag, whose default is tensorboard):
// TensorBoard event files, metrics.jsonl, or both, all in OUTPUT_DIR/<logging_dir>. The loop calls one object
// and never needs to know which.
#pragma once
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/image.h"
#include "train/metrics_log.h"
#include "train/tensorboard.h"

namespace sd::train {

struct ReportTo {
  bool tensorboard = true;
  bool jsonl = false;
};

// "tensorboard", "jsonl" or "all"; anything else throws sd::Error naming --report_to.
ReportTo parse_report_to(const std::string& value);

class MetricsSink {
 public:
  // Writes nothing: what ranks other than the first hold.
  MetricsSink() = default;
  MetricsSink(const std::filesystem::path& logging_dir, ReportTo report_to);

  // One optimizer step's record ({"step": N, "loss": ..., ...}), written and flushed to every destination.
  void log_step(const nlohmann::json& record);
  // The validation images of a step, tagged validation/<i> in TensorBoard. metrics.jsonl holds no images: the
  // trainer saves them as PNGs in OUTPUT_DIR/validation/, where `sdtrain report` finds them.
  void log_validation_images(int64_t step, const std::vector<io::RgbImage>& images);

 private:
  MetricsLog jsonl_;
  std::optional<TensorBoardWriter> tensorboard_;
};

}  // namespace sd::train
