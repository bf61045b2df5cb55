// Line charts as inline SVG for the HTML report: the raw curve drawn faint, its smoothed twin drawn bold, and axes
// with round-numbered ticks. The SVG has a fixed viewBox and scales with the page.
#pragma once
#include <string>
#include <vector>

namespace sd::report {

// One metric over the training steps. A NaN value (a diverged loss, a key a record lacks) leaves a gap.
struct Series {
  std::vector<double> steps;
  std::vector<double> values;
};

// TensorBoard's scalar smoothing: an exponential moving average with `weight` (0 = none, TensorBoard's default
// 0.6), debiased so the first points are not pulled toward the average's zero start. NaN values stay NaN and do
// not enter the average.
std::vector<double> smooth_ema(const std::vector<double>& values, double weight);

// About `count` ticks at a round spacing (1, 2 or 5 times a power of ten, and at least `min_spacing`), from the
// last one at or below `low` to the first one at or above `high`.
std::vector<double> nice_ticks(double low, double high, int count, double min_spacing = 0);

// A tick label with the decimals its spacing needs ("0.5", "250"), or mantissa and exponent for tiny spacings
// ("2e-5", "1e-4"), as a learning rate needs.
std::string tick_label(double value, double spacing);

// An <svg> chart of smooth_ema(series, smoothing) over the raw series drawn faint, in `color` (any CSS color).
// With smoothing 0 the raw series alone is the curve (a learning-rate schedule is exact; smoothing would distort it).
std::string line_chart_svg(const Series& series, double smoothing, const std::string& color);

}  // namespace sd::report
