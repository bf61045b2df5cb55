// Where the training loop's metrics go, all in OUTPUT_DIR/<logging_dir>: metrics.jsonl always (the run's ledger: a
// resume trims it to the checkpoint, `sdtrain report` reads it), plus TensorBoard event files when --report_to
// (diffusers' flag, whose default is tensorboard) asks for them. The loop calls one object and never needs to know.
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

// Whether --report_to asks for TensorBoard event files: "tensorboard" and "all" do, "jsonl" does not; anything else
// throws sd::Error naming --report_to.
bool reports_to_tensorboard(const std::string& report_to);

class MetricsSink {
 public:
  // Writes nothing: what ranks other than the first hold.
  MetricsSink() = default;
  // A run resumed at `resumed_step` first drops the metrics.jsonl lines of later steps (see MetricsLog).
  MetricsSink(const std::filesystem::path& logging_dir, const std::string& report_to, int64_t resumed_step);

  // One optimizer step's record ({"step": N, "loss": ..., ...}), written and flushed to every destination.
  void log_step(const nlohmann::json& record);
  // The validation images of a step, tagged validation/<i> in TensorBoard. metrics.jsonl holds no images: the
  // trainer saves them as PNGs in OUTPUT_DIR/validation/, where `sdtrain report` finds them.
  void log_validation_images(int64_t step, const std::vector<io::RgbImage>& images);
  bool is_open() const { return jsonl_.is_open(); }

 private:
  MetricsLog jsonl_;
  std::optional<TensorBoardWriter> tensorboard_;
};

}  // namespace sd::train
