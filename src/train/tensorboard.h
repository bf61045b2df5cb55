// TensorBoard event files, written natively: `tensorboard --logdir OUTPUT_DIR/logs` shows the training scalars and
// the validation images. The format is TensorBoard's own (TFRecord-framed `Event` protobufs), encoded by hand here
// so that sdtrain needs no protobuf library.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "io/atomic_file.h"
#include "io/image.h"

namespace sd::train {

class TensorBoardWriter {
 public:
  // Creates `dir` and a new `events.out.tfevents.<unix time>.<hostname>.<pid>` file in it (never appends: a resumed
  // run adds a file beside the old one, and TensorBoard reads every file of the folder as one run).
  explicit TensorBoardWriter(const std::filesystem::path& dir);

  void add_scalar(const std::string& tag, int64_t step, double value);
  // Stored PNG-encoded, as TensorBoard's image dashboard expects.
  void add_image(const std::string& tag, int64_t step, const io::RgbImage& image);
  // Pushes the records written so far to the file, so a crash loses at most the current step's.
  void flush();

  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& event);
  std::filesystem::path path_;
  std::unique_ptr<io::FileWriter> out_;
};

// Writes one metrics record (the object metrics.jsonl holds for an optimizer step: {"step": 12, "loss": ..., ...})
// as scalars at record["step"]: loss, lr, grad_norm and epoch under `train/`, step_time_s, images_per_s and
// data_wait_s under `speed/`, any other number under `train/`. Then flushes.
void write_metrics_record(TensorBoardWriter& writer, const nlohmann::json& record);

}  // namespace sd::train
