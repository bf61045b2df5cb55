#include "train/metrics_sink.h"

#include "core/error.h"

namespace sd::train {

ReportTo parse_report_to(const std::string& value) {
  if (value == "tensorboard") return {true, false};
  if (value == "jsonl") return {false, true};
  if (value == "all") return {true, true};
  fail("--report_to {}: expected tensorboard, jsonl or all", value);
}

MetricsSink::MetricsSink(const std::filesystem::path& logging_dir, ReportTo report_to) {
  if (report_to.jsonl) jsonl_ = MetricsLog(logging_dir / "metrics.jsonl");
  if (report_to.tensorboard) tensorboard_.emplace(logging_dir);
}

void MetricsSink::log_step(const nlohmann::json& record) {
  jsonl_.write(record);
  if (tensorboard_) write_metrics_record(*tensorboard_, record);
}

void MetricsSink::log_validation_images(int64_t step, const std::vector<io::RgbImage>& images) {
  if (!tensorboard_) return;
  for (size_t i = 0; i < images.size(); ++i) tensorboard_->add_image(fmt::format("validation/{}", i), step, images[i]);
  tensorboard_->flush();
}

}  // namespace sd::train
