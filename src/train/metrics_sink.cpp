#include "train/metrics_sink.h"

#include "core/error.h"

namespace sd::train {

bool reports_to_tensorboard(const std::string& report_to) {
  if (report_to == "tensorboard" || report_to == "all") return true;
  if (report_to == "jsonl") return false;
  fail(
      "--report_to {}: expected tensorboard, jsonl or all (sdtrain writes files only; wandb and comet need "
      "their Python clients)",
      report_to);
}

MetricsSink::MetricsSink(const std::filesystem::path& logging_dir, const std::string& report_to, int64_t resumed_step)
    : jsonl_(logging_dir / "metrics.jsonl", resumed_step) {
  if (reports_to_tensorboard(report_to)) tensorboard_.emplace(logging_dir);
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
