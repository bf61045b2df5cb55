#include "report/html_report.h"

#include <stb_image.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "io/atomic_file.h"
#include "report/svg_chart.h"
#include "train/checkpoints.h"

namespace sd::report {

namespace fs = std::filesystem;

namespace {

// TensorBoard's default smoothing weight, so the curves read as they would there.
constexpr double kSmoothing = 0.6;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Validation images are shown this many CSS pixels wide; smaller ones are scaled up without blurring.
constexpr int kImageWidth = 176;

struct ChartSpec {
  const char* key;  // in metrics.jsonl
  const char* title;
  const char* color;
  double smoothing;  // 0 for a quantity that is exact rather than noisy: the learning rate schedule
};
constexpr ChartSpec kCharts[] = {{"loss", "Loss", "#2563eb", kSmoothing},
                                 {"lr", "Learning rate", "#059669", 0},
                                 {"grad_norm", "Gradient norm", "#7c3aed", kSmoothing},
                                 {"images_per_s", "Images per second", "#ea580c", kSmoothing}};

constexpr const char* kStyle = R"css(
:root { --text: #111827; --muted: #6b7280; --line: #e5e7eb; --page: #f6f7f9; --card: #ffffff; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--page); color: var(--text);
       font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 32px 24px 48px; }
h1 { font-size: 26px; font-weight: 650; margin: 0; letter-spacing: -0.01em; }
h2 { font-size: 18px; font-weight: 600; margin: 40px 0 12px; }
h3 { font-size: 15px; font-weight: 600; margin: 0; }
.subtitle, .muted, footer { color: var(--muted); }
.subtitle { margin: 4px 0 0; word-break: break-all; }
.tiles { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: 12px; margin-top: 24px; }
.tile, .card, table { background: var(--card); border: 1px solid var(--line); border-radius: 10px; }
.tile { padding: 12px 16px; }
.tile .label { font-size: 12px; color: var(--muted); text-transform: uppercase; letter-spacing: 0.04em; }
.tile .value { font-size: 21px; font-weight: 600; font-variant-numeric: tabular-nums; white-space: nowrap; }
.tile .note { font-size: 12px; color: var(--muted); min-height: 1.5em; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(440px, 1fr)); gap: 16px; }
.card { padding: 16px 16px 12px; }
.card-head { display: flex; justify-content: space-between; align-items: baseline; }
.latest { font-variant-numeric: tabular-nums; color: var(--muted); font-size: 13px; }
.legend { font-size: 12px; color: var(--muted); margin-top: 4px; }
.swatch { display: inline-block; width: 14px; height: 3px; border-radius: 2px; vertical-align: middle;
          margin: 0 6px 0 12px; }
.swatch.raw { opacity: 0.3; }
svg.chart { display: block; width: 100%; height: auto; margin-top: 8px; overflow: visible; }
svg .grid { stroke: #eef0f3; }
svg .axis { stroke: #9ca3af; }
svg .tick { font-size: 11px; fill: var(--muted); font-variant-numeric: tabular-nums; }
svg .axis-label { font-size: 12px; fill: #374151; }
svg path { fill: none; stroke-linejoin: round; stroke-linecap: round; }
svg .raw { stroke-width: 1.2; opacity: 0.3; }
svg .curve { stroke-width: 2; }
.validation-step { display: flex; gap: 16px; align-items: flex-start; padding: 12px 0;
                   border-top: 1px solid var(--line); }
.validation-step .step { width: 90px; flex: none; font-weight: 600; font-variant-numeric: tabular-nums; }
.validation-step .images { display: flex; flex-wrap: wrap; gap: 10px; }
.validation-step img { border-radius: 6px; background: var(--line); }
img.pixelated { image-rendering: pixelated; }
.prompt { margin: 0 0 8px; }
pre.command { background: var(--card); border: 1px solid var(--line); border-radius: 10px; padding: 12px 16px;
              white-space: pre-wrap; word-break: break-all; font-size: 13px; margin: 0 0 16px; }
table { border-collapse: separate; border-spacing: 0; width: 100%; overflow: hidden; font-size: 14px; }
th, td { text-align: left; padding: 7px 16px; border-top: 1px solid var(--line); vertical-align: top; }
tr:first-child th, tr:first-child td { border-top: none; }
th { font-weight: 500; color: var(--muted); width: 32%; }
td { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 13px; word-break: break-all; }
td.number { font-variant-numeric: tabular-nums; }
footer { margin-top: 48px; font-size: 13px; }
)css";

std::string escape_html(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string base64(const std::string& bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    // Three bytes make four 6-bit digits; a short last group is padded with '='.
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t group = 0;
    for (size_t k = 0; k < 3; ++k) group = group << 8 | (k < n ? static_cast<uint8_t>(bytes[i + k]) : 0);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? kAlphabet[(group >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

// Four significant digits: enough to compare losses, short enough to scan.
std::string format_number(double value) { return std::isfinite(value) ? fmt::format("{:.4g}", value) : "–"; }

std::string format_seconds(double seconds) { return std::isfinite(seconds) ? format_number(seconds) + " s" : "–"; }

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds)) return "–";
  if (seconds < 60) return fmt::format("{:.1f} s", seconds);
  const auto whole = static_cast<int64_t>(seconds);
  if (whole < 3600) return fmt::format("{} min {:02} s", whole / 60, whole % 60);
  return fmt::format("{} h {:02} min", whole / 3600, whole / 60 % 60);
}

std::string format_megabytes(uintmax_t bytes) { return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6); }

// A metric's value at every logged step; NaN where a record lacks it (or logged a NaN, which JSON writes as null).
Series metric_series(const RunFiles& run, const std::string& key) {
  Series series;
  for (const auto& [step, record] : run.steps) {
    const auto value = record.find(key);
    series.steps.push_back(static_cast<double>(step));
    series.values.push_back(value != record.end() && value->is_number() ? value->get<double>() : kNaN);
  }
  return series;
}

std::vector<double> finite_values(const std::vector<double>& values) {
  std::vector<double> out;
  std::copy_if(values.begin(), values.end(), std::back_inserter(out), [](double v) { return std::isfinite(v); });
  return out;
}

// The median rather than the mean for speeds: the first steps (warm-up, allocation) are far slower than the rest.
double median(const std::vector<double>& values) {
  std::vector<double> finite = finite_values(values);
  if (finite.empty()) return kNaN;
  std::nth_element(finite.begin(), finite.begin() + finite.size() / 2, finite.end());
  return finite[finite.size() / 2];
}

double last_finite(const std::vector<double>& values) {
  const auto it = std::find_if(values.rbegin(), values.rend(), [](double v) { return std::isfinite(v); });
  return it != values.rend() ? *it : kNaN;
}

// The run's flags from run.json ({} when unknown).
nlohmann::json run_flags(const RunFiles& run) {
  if (!run.run_info) return nlohmann::json::object();
  const nlohmann::json flags = run.run_info->value("flags", nlohmann::json::object());
  return flags.is_object() ? flags : nlohmann::json::object();
}

// The run folder's absolute path, its name as a title.
fs::path run_path(const RunFiles& run) { return fs::weakly_canonical(fs::absolute(run.output_dir)); }

// A run.json field as text, or `fallback` when there is no run.json or no such field.
std::string run_info_string(const RunFiles& run, const std::string& key, const std::string& fallback) {
  if (!run.run_info || !run.run_info->contains(key)) return fallback;
  const nlohmann::json& value = (*run.run_info)[key];
  return value.is_string() ? value.get<std::string>() : value.dump();
}

std::string header_section(const RunFiles& run) {
  const fs::path dir = run_path(run);
  const std::string started = run_info_string(run, "started", "");
  return fmt::format(R"(<header><h1>Training report: {}</h1><p class="subtitle">{}{}</p></header>)",
                     escape_html(dir.filename().string()), escape_html(dir.string()),
                     started.empty() ? "" : " · started " + escape_html(started));
}

std::string tile(const std::string& label, const std::string& value, const std::string& note = "") {
  return fmt::format(R"(<div class="tile"><div class="label">{}</div><div class="value">{}</div>)"
                     R"(<div class="note">{}</div></div>)",
                     label, escape_html(value), note);
}

std::string summary_section(const RunFiles& run) {
  const Series loss = metric_series(run, "loss");
  const std::vector<double> step_times = finite_values(metric_series(run, "step_time_s").values);
  double training_seconds = 0;
  for (double t : step_times) training_seconds += t;
  return R"(<section class="tiles">)" + tile("Last step", std::to_string(run.steps.rbegin()->first)) +
         tile("Final loss", format_number(last_finite(smooth_ema(loss.values, kSmoothing))), "smoothed") +
         tile("Images / s", format_number(median(metric_series(run, "images_per_s").values)), "median, all ranks") +
         tile("Step time", format_seconds(median(step_times)), "median") +
         tile("Training time", format_duration(step_times.empty() ? kNaN : training_seconds), "sum of steps") +
         tile("World size", run_info_string(run, "world_size", "–"), "ranks") +
         tile("Checkpoints", std::to_string(run.checkpoints.size())) + "</section>";
}

std::string legend(const ChartSpec& spec) {
  if (spec.smoothing == 0) return "";
  return fmt::format(R"(<div class="legend"><span class="swatch raw" style="background:{0}"></span>raw)"
                     R"(<span class="swatch" style="background:{0}"></span>smoothed (exponential moving average, {1}))"
                     "</div>",
                     spec.color, spec.smoothing);
}

std::string chart_card(const ChartSpec& spec, const Series& series) {
  return fmt::format(R"(<div class="card" id="chart-{}"><div class="card-head"><h3>{}</h3>)"
                     R"(<span class="latest">last {}</span></div>{}{}</div>)",
                     spec.key, spec.title, format_number(last_finite(series.values)),
                     line_chart_svg(series, spec.smoothing, spec.color), legend(spec));
}

std::string charts_section(const RunFiles& run) {
  std::string cards;
  for (const ChartSpec& spec : kCharts) {
    const Series series = metric_series(run, spec.key);
    if (!finite_values(series.values).empty()) cards += chart_card(spec, series);
  }
  return R"(<h2>Curves</h2><div class="charts">)" + cards + "</div>";
}

std::string image_tag(const ValidationImage& image) {
  const std::string png = io::read_text_file(image.path);
  int width = 0, height = 0, channels = 0;
  SD_CHECK(stbi_info_from_memory(reinterpret_cast<const stbi_uc*>(png.data()), static_cast<int>(png.size()), &width,
                                 &height, &channels),
           "{}: not a readable PNG image", image.path.string());
  return fmt::format(
      R"(<img src="data:image/png;base64,{}" width="{}" height="{}" class="{}" alt="step {} image {}" title="{}">)",
      base64(png), kImageWidth, kImageWidth * height / width, width < kImageWidth ? "pixelated" : "", image.step,
      image.index, escape_html(image.path.filename().string()));
}

std::string validation_section(const RunFiles& run) {
  std::string html = "<h2>Validation images</h2>";
  if (run.validation_images.empty())
    return html + R"(<p class="muted">None in validation/ (the run had no --validation_prompt).</p>)";
  const nlohmann::json prompt = run_flags(run).value("validation_prompt", nlohmann::json());
  if (prompt.is_string())
    html += fmt::format(R"(<p class="prompt"><span class="muted">Prompt:</span> {}</p>)",
                        escape_html(prompt.get<std::string>()));
  std::map<int64_t, std::string> images_by_step;
  for (const ValidationImage& image : run.validation_images) images_by_step[image.step] += image_tag(image);
  for (const auto& [step, images] : images_by_step)
    html += fmt::format(R"(<div class="validation-step"><div class="step">step {}</div><div class="images">{})"
                        "</div></div>",
                        step, images);
  return html;
}

std::string run_section(const RunFiles& run) {
  std::string html = "<h2>Run</h2>";
  if (!run.run_info) return html + R"(<p class="muted">No run.json in the logging folder: flags unknown.</p>)";
  html += fmt::format(R"(<pre class="command">{}</pre>)", escape_html(run_info_string(run, "command", "")));
  const nlohmann::json flags = run_flags(run);
  if (flags.empty()) return html;
  html += "<table>";
  for (const auto& flag : flags.items()) {
    const std::string value = flag.value().is_string() ? flag.value().get<std::string>() : flag.value().dump();
    html += fmt::format("<tr><th>--{}</th><td>{}</td></tr>", escape_html(flag.key()), escape_html(value));
  }
  return html + "</table>";
}

uintmax_t folder_bytes(const fs::path& dir) {
  uintmax_t total = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.is_regular_file()) total += entry.file_size();
  return total;
}

std::string checkpoints_section(const RunFiles& run) {
  std::string html = "<h2>Checkpoints</h2>";
  if (run.checkpoints.empty()) return html + R"(<p class="muted">No checkpoint-N folders.</p>)";
  html += "<table>";
  for (const fs::path& checkpoint : run.checkpoints)
    html += fmt::format(R"(<tr><th>{}</th><td class="number">{}</td></tr>)",
                        escape_html(checkpoint.filename().string()), format_megabytes(folder_bytes(checkpoint)));
  return html + "</table>";
}

}  // namespace

std::string render_report_html(const RunFiles& run) {
  return fmt::format(R"(<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">)"
                     R"(<meta name="viewport" content="width=device-width, initial-scale=1">)"
                     R"(<title>sdtrain report: {}</title><style>{}</style></head><body><main>)"
                     "{}{}{}{}{}{}<footer>Written by <code>sdtrain report</code>.</footer></main></body></html>\n",
                     escape_html(run_path(run).filename().string()), kStyle, header_section(run), summary_section(run),
                     charts_section(run), validation_section(run), run_section(run), checkpoints_section(run));
}

fs::path write_report(const fs::path& output_dir, const std::string& logging_dir) {
  const RunFiles run = read_run_files(output_dir, logging_dir);
  const fs::path path = output_dir / "report.html";
  io::write_text_file(path, render_report_html(run));
  return path;
}

}  // namespace sd::report
