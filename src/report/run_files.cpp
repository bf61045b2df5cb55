#include "report/run_files.h"

#include <regex>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "train/checkpoints.h"

namespace sd::report {

namespace fs = std::filesystem;

namespace {

// One object per line. A last line without its newline is what a crash mid-write leaves: it is skipped when it
// does not parse, so a crashed run, whose report matters most, still gets one.
std::map<int64_t, nlohmann::json> read_metrics(const fs::path& path) {
  SD_CHECK(fs::exists(path), "{}: metrics file not found (check --logging_dir; every training run writes it there)",
           path.string());
  const std::string text = io::read_text_file(path);
  std::map<int64_t, nlohmann::json> steps;
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const bool unterminated = lines.eof() && text.back() != '\n';
    nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded() && unterminated) break;
    SD_CHECK(!record.is_discarded(), "{}:{}: not valid JSON", path.string(), number);
    SD_CHECK(record.is_object() && record.contains("step") && record["step"].is_number_integer(),
             "{}:{}: expected a JSON object with an integer \"step\"", path.string(), number);
    const auto step = record["step"].get<int64_t>();
    steps[step] = std::move(record);
  }
  SD_CHECK(!steps.empty(), "{}: no metrics records", path.string());
  return steps;
}

std::optional<nlohmann::json> read_run_info(const fs::path& path) {
  if (!fs::exists(path)) return std::nullopt;
  nlohmann::json info = nlohmann::json::parse(io::read_text_file(path), nullptr, /*allow_exceptions=*/false);
  SD_CHECK(info.is_object(), "{}: expected a JSON object", path.string());
  return info;
}

std::vector<ValidationImage> find_validation_images(const fs::path& dir) {
  static const std::regex kName(R"(step-(\d+)-(\d+)\.png)");
  std::vector<ValidationImage> images;
  if (!fs::is_directory(dir)) return images;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (entry.is_regular_file() && std::regex_match(name, m, kName))
      images.push_back({std::stoll(m[1]), std::stoll(m[2]), entry.path()});
  }
  std::sort(images.begin(), images.end(), [](const ValidationImage& a, const ValidationImage& b) {
    return std::tie(a.step, a.index) < std::tie(b.step, b.index);
  });
  return images;
}

}  // namespace

RunFiles read_run_files(const fs::path& output_dir, const std::string& logging_dir) {
  SD_CHECK(fs::is_directory(output_dir), "{}: run folder not found", output_dir.string());
  RunFiles run;
  run.output_dir = output_dir;
  run.steps = read_metrics(output_dir / logging_dir / "metrics.jsonl");
  run.run_info = read_run_info(output_dir / logging_dir / "run.json");
  run.validation_images = find_validation_images(output_dir / "validation");
  run.checkpoints = train::list_checkpoints(output_dir);
  return run;
}

}  // namespace sd::report
