// `sdtrain report`: one self-contained HTML page about a training run (inline CSS, SVG charts, images as data URIs;
// nothing fetched), for a person to read in a browser: a summary, the loss / lr / gradient-norm / throughput
// curves, the validation images by step, the run's flags and the checkpoints present.
#pragma once
#include <filesystem>
#include <string>

#include "report/run_files.h"

namespace sd::report {

std::string render_report_html(const RunFiles& run);

// Reads the run in `output_dir` (metrics in <logging_dir>/) and writes output_dir/report.html atomically.
// Returns the path written.
std::filesystem::path write_report(const std::filesystem::path& output_dir, const std::string& logging_dir);

}  // namespace sd::report
