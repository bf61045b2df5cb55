// The report's charts: TensorBoard's smoothing, round tick values and labels, and curves with gaps.
#include "report/svg_chart.h"

#include <gtest/gtest.h>

#include <cmath>

namespace sd::report {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(SvgChart, SmoothingIsTensorBoardsDebiasedAverage) {
  // Weight 0.5 over {0, 1}: the raw averages are 0 and 0.5, debiased by 1 - 0.5 and 1 - 0.25.
  const auto smoothed = smooth_ema({0, 1}, 0.5);
  EXPECT_DOUBLE_EQ(smoothed[0], 0);
  EXPECT_DOUBLE_EQ(smoothed[1], 0.5 / 0.75);
  // The first point is its own value, a constant stays constant, and weight 0 leaves the curve as it is.
  EXPECT_DOUBLE_EQ(smooth_ema({3, 3, 3}, 0.6)[2], 3);
  EXPECT_DOUBLE_EQ(smooth_ema({7, 1}, 0.9)[0], 7);
  EXPECT_EQ(smooth_ema({1, 5, 2}, 0), (std::vector<double>{1, 5, 2}));
}

TEST(SvgChart, NanIsAGapNotAPoison) {
  const auto smoothed = smooth_ema({2, kNaN, 2}, 0.6);
  EXPECT_DOUBLE_EQ(smoothed[0], 2);
  EXPECT_TRUE(std::isnan(smoothed[1]));
  EXPECT_DOUBLE_EQ(smoothed[2], 2);
}

TEST(SvgChart, TicksAreRoundAndCoverTheRange) {
  const auto ticks = nice_ticks(0.13, 0.87, 5);
  ASSERT_EQ(ticks.size(), 6u);
  for (size_t i = 0; i < ticks.size(); ++i) EXPECT_NEAR(ticks[i], 0.2 * i, 1e-12);
  EXPECT_EQ(nice_ticks(1, 50, 6, 1), (std::vector<double>{0, 10, 20, 30, 40, 50}));
  EXPECT_EQ(nice_ticks(1, 3, 6, 1), (std::vector<double>{1, 2, 3})) << "steps are whole numbers";
}

TEST(SvgChart, TickLabelsUseTheDecimalsTheirSpacingNeeds) {
  EXPECT_EQ(tick_label(0.6000000000000001, 0.2), "0.6");
  EXPECT_EQ(tick_label(250, 50), "250");
  EXPECT_EQ(tick_label(1e-17, 0.2), "0");
  EXPECT_EQ(tick_label(2e-5, 1e-5), "2e-5");
  EXPECT_EQ(tick_label(1e-4, 2e-5), "1e-4") << "one axis, one notation";
  EXPECT_EQ(tick_label(0.0025, 0.0005), "2.5e-3");
}

TEST(SvgChart, ChartHasRawAndSmoothedCurvesBrokenAtGaps) {
  const std::string svg = line_chart_svg({{1, 2, 3, 4, 5}, {1, 0.8, kNaN, 0.5, kNaN}}, 0.6, "#123456");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find(R"(<path class="curve" d="M)"), std::string::npos);
  const auto raw = svg.find(R"(<path class="raw" d="M)");
  ASSERT_NE(raw, std::string::npos);
  // Two runs: steps 1-2 as a line, step 4 alone as a dot.
  const std::string raw_path = svg.substr(raw, svg.find("/>", raw) - raw);
  EXPECT_EQ(std::count(raw_path.begin(), raw_path.end(), 'M'), 2) << raw_path;
  EXPECT_NE(raw_path.find(" l0,0"), std::string::npos) << raw_path;
  EXPECT_NE(svg.find(R"(stroke="#123456")"), std::string::npos);
  EXPECT_NE(svg.find(">step</text>"), std::string::npos);
}

TEST(SvgChart, UnsmoothedChartIsTheRawCurveAlone) {
  const std::string svg = line_chart_svg({{1, 2, 3}, {1e-4, 2e-4, 3e-4}}, 0, "green");
  EXPECT_EQ(svg.find(R"(class="raw")"), std::string::npos);
  EXPECT_NE(svg.find(R"(<path class="curve" d="M)"), std::string::npos);
}

}  // namespace
}  // namespace sd::report
