// What `sdtrain report` reads from a training run's output folder: the per-step metrics, the run's description
// (run.json, optional), the validation images and the checkpoints. Bad input throws sd::Error naming the file and,
// for the metrics, the line.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace sd::report {

struct ValidationImage {
  int64_t step = 0;
  int64_t index = 0;
  std::filesystem::path path;
};

struct RunFiles {
  std::filesystem::path output_dir;
  // <logging_dir>/metrics.jsonl by step. A resumed run appends to the file, so a step logged twice keeps its last
  // record (the run that went on).
  std::map<int64_t, nlohmann::json> steps;
  // <logging_dir>/run.json: {"command", "argv", "flags" (given), "defaults" (of the flags not given), "world_size",
  // "started"}; runs before it have none.
  std::optional<nlohmann::json> run_info;
  // validation/step-<N>-<i>.png, sorted by step, then index.
  std::vector<ValidationImage> validation_images;
  // checkpoint-N folders, sorted by N.
  std::vector<std::filesystem::path> checkpoints;
};

RunFiles read_run_files(const std::filesystem::path& output_dir, const std::string& logging_dir);

}  // namespace sd::report
