#include "report/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace sd::report {

namespace {

// The chart's coordinate system (the viewBox) and its plot area inside the margins that hold the tick labels.
constexpr double kWidth = 560, kHeight = 240;
constexpr double kPlotLeft = 58, kPlotRight = kWidth - 14, kPlotTop = 10, kPlotBottom = kHeight - 40;
constexpr int kTickCount = 5;

// Maps a data interval onto a pixel interval (which may run backwards, as the y axis does).
struct Axis {
  double low, high;
  double pixel_low, pixel_high;
  double to_pixel(double v) const { return pixel_low + (v - low) / (high - low) * (pixel_high - pixel_low); }
};

std::pair<double, double> finite_range(const std::vector<double>& values) {
  double low = std::numeric_limits<double>::infinity(), high = -low;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    low = std::min(low, v);
    high = std::max(high, v);
  }
  if (low > high) return {0, 1};  // nothing finite: an empty frame
  if (low == high) {
    // A constant (a fixed learning rate): centre it in a band of +-10 %, so it reads as a level line.
    const double pad = low != 0 ? std::fabs(low) * 0.1 : 1;
    return {low - pad, high + pad};
  }
  return {low, high};
}

// The SVG path of a curve: runs of finite points become polylines; a run of one point becomes a dot (a zero-length
// line with round caps), so a lone value between gaps still shows.
std::string path_data(const std::vector<double>& steps, const std::vector<double>& values, const Axis& x,
                      const Axis& y) {
  std::string d;
  size_t run_length = 0;
  auto end_run = [&] {
    if (run_length == 1) d += " l0,0";
    run_length = 0;
  };
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      end_run();
      continue;
    }
    const char* command = run_length > 0 ? " L" : d.empty() ? "M" : " M";
    d += fmt::format("{}{:.1f},{:.1f}", command, x.to_pixel(steps[i]), y.to_pixel(values[i]));
    ++run_length;
  }
  end_run();
  return d;
}

std::string grid_and_ticks(const Axis& x, const std::vector<double>& x_ticks, const Axis& y,
                           const std::vector<double>& y_ticks) {
  std::string svg;
  const double y_spacing = y_ticks.size() > 1 ? y_ticks[1] - y_ticks[0] : 1;
  for (double tick : y_ticks) {
    const double py = y.to_pixel(tick);
    svg += fmt::format(R"(<line class="grid" x1="{:.1f}" x2="{:.1f}" y1="{:.1f}" y2="{:.1f}"/>)", kPlotLeft, kPlotRight,
                       py, py);
    svg += fmt::format(R"(<text class="tick" x="{:.1f}" y="{:.1f}" text-anchor="end" dy="0.32em">{}</text>)",
                       kPlotLeft - 8, py, tick_label(tick, y_spacing));
  }
  const double x_spacing = x_ticks.size() > 1 ? x_ticks[1] - x_ticks[0] : 1;
  for (double tick : x_ticks) {
    const double px = x.to_pixel(tick);
    svg += fmt::format(R"(<line class="axis" x1="{:.1f}" x2="{:.1f}" y1="{:.1f}" y2="{:.1f}"/>)", px, px, kPlotBottom,
                       kPlotBottom + 5);
    svg += fmt::format(R"(<text class="tick" x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)", px,
                       kPlotBottom + 18, tick_label(tick, x_spacing));
  }
  svg += fmt::format(R"(<line class="axis" x1="{:.1f}" x2="{:.1f}" y1="{:.1f}" y2="{:.1f}"/>)", kPlotLeft, kPlotRight,
                     kPlotBottom, kPlotBottom);
  svg += fmt::format(R"(<text class="axis-label" x="{:.1f}" y="{:.1f}" text-anchor="middle">step</text>)",
                     (kPlotLeft + kPlotRight) / 2, kHeight - 4);
  return svg;
}

}  // namespace

std::vector<double> smooth_ema(const std::vector<double>& values, double weight) {
  std::vector<double> out;
  double average = 0;
  int averaged = 0;
  for (double v : values) {
    if (!std::isfinite(v)) {
      out.push_back(v);
      continue;
    }
    average = average * weight + (1 - weight) * v;
    ++averaged;
    // The average started at 0; dividing by the weight its real terms carry so far removes that bias.
    const double debias = weight == 1 ? 1 : 1 - std::pow(weight, averaged);
    out.push_back(average / debias);
  }
  return out;
}

std::vector<double> nice_ticks(double low, double high, int count, double min_spacing) {
  const double rough = (high - low) / count;
  const double magnitude = std::pow(10, std::floor(std::log10(rough)));
  const double fraction = rough / magnitude;
  const double round = fraction <= 1 ? 1 : fraction <= 2 ? 2 : fraction <= 5 ? 5 : 10;
  const double spacing = std::max(round * magnitude, min_spacing);
  const double first = std::floor(low / spacing), last = std::ceil(high / spacing);
  std::vector<double> ticks;
  // Multiples of the spacing, counted in integers, so no rounding error accumulates along the axis.
  for (double k = first; k <= last; ++k) ticks.push_back(k * spacing);
  return ticks;
}

std::string tick_label(double value, double spacing) {
  if (std::fabs(value) < spacing * 1e-6) return "0";
  if (spacing < 1e-3 || std::fabs(value) >= 1e6) {
    // Mantissa and exponent, without printf's "e-05" padding.
    const int exponent = static_cast<int>(std::floor(std::log10(std::fabs(value)) + 1e-9));
    return fmt::format("{:.3g}e{}", value / std::pow(10, exponent), exponent);
  }
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(spacing) + 1e-9)));
  return fmt::format("{:.{}f}", value, decimals);
}

std::string line_chart_svg(const Series& series, double smoothing, const std::string& color) {
  const auto [step_low, step_high] = finite_range(series.steps);
  const auto [value_low, value_high] = finite_range(series.values);
  const std::vector<double> x_ticks = nice_ticks(step_low, step_high, kTickCount + 1, 1);
  const std::vector<double> y_ticks = nice_ticks(value_low, value_high, kTickCount);
  const Axis x{x_ticks.front(), x_ticks.back(), kPlotLeft, kPlotRight};
  const Axis y{y_ticks.front(), y_ticks.back(), kPlotBottom, kPlotTop};
  // The raw curve is drawn faint behind the smoothed one; unsmoothed, it is the curve itself.
  const std::string raw = path_data(series.steps, series.values, x, y);
  const std::string behind = smoothing > 0 ? fmt::format(R"(<path class="raw" d="{}" stroke="{}"/>)", raw, color) : "";
  const std::string curve = smoothing > 0 ? path_data(series.steps, smooth_ema(series.values, smoothing), x, y) : raw;
  return fmt::format(R"(<svg class="chart" viewBox="0 0 {} {}" role="img">{}{}<path class="curve" d="{}" stroke="{}"/>)"
                     "</svg>",
                     kWidth, kHeight, grid_and_ticks(x, x_ticks, y, y_ticks), behind, curve, color);
}

}  // namespace sd::report
