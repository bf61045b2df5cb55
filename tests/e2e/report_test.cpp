// End-to-end: `sdtrain report` on a synthetic run the test writes (metrics, validation PNGs, a checkpoint, run.json),
// read as text and rendered by headless Chromium, and its one-line errors.
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/image.h"
#include "process_util.h"
#include "test_util.h"

namespace sd {
namespace {

namespace fs = std::filesystem;
using sd::test::run_command;

std::string sdtrain(const std::string& args) { return sd::test::sdtrain_binary() + " " + args; }

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// 60 steps of a noisy decaying loss with a warm-up learning rate, validation images at steps 20 and 40 (two each),
// one checkpoint and a run.json.
void write_synthetic_run(const fs::path& out) {
  fs::create_directories(out / "logs");
  std::ofstream metrics(out / "logs" / "metrics.jsonl");
  for (int step = 1; step <= 60; ++step) {
    metrics << nlohmann::json{{"step", step},
                              {"epoch", (step - 1) / 20},
                              {"loss", 0.1 + 0.4 * std::exp(-step / 15.0) + 0.03 * std::sin(step * 1.7)},
                              {"lr", 1e-4 * std::min(1.0, step / 10.0)},
                              {"grad_norm", 2.0 / std::sqrt(step) + 0.1 * std::cos(step)},
                              {"step_time_s", step == 1 ? 1.5 : 0.25},
                              {"images_per_s", step == 1 ? 1.3 : 8.0 + 0.3 * std::sin(step)}}
                   .dump()
            << '\n';
  }
  for (int step : {20, 40})
    for (int i = 0; i < 2; ++i)
      sd::test::write_pattern_png(out / "validation" / fmt::format("step-{}-{}.png", step, i), 64, 64, 3 + step + i);
  fs::create_directories(out / "checkpoint-40");
  std::ofstream(out / "checkpoint-40" / "training_state.json") << "{}";
  std::ofstream(out / "checkpoint-40" / "manifest.json") << "{}";  // whole: the report lists only whole checkpoints
  io::write_text_file(
      out / "logs" / "run.json",
      nlohmann::json{{"command", "sdtrain textual-inversion --seed=7"},
                     {"argv", {"textual-inversion", "--seed=7"}},
                     {"flags", {{"seed", 7}, {"learning_rate", 1e-4}, {"validation_prompt", "a photo of <cat-toy>"}}},
                     {"world_size", 3},
                     {"started", "2024-05-01T12:00:00Z"}}
          .dump());
}

class ReportE2E : public ::testing::Test {
 protected:
  void SetUp() override { write_synthetic_run(run_dir()); }
  fs::path run_dir() const { return dir_.path() / "run"; }
  fs::path report_path() const { return run_dir() / "report.html"; }
  sd::test::CommandResult report() const { return run_command(sdtrain("report " + run_dir().string())); }

  sd::test::TempDir dir_;
};

TEST_F(ReportE2E, WritesOneSelfContainedPage) {
  const auto r = report();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, report_path().string() + "\n");
  const std::string html = io::read_text_file(report_path());
  EXPECT_EQ(count(html, R"(<svg class="chart")"), 4u) << "loss, lr, grad norm, images/s";
  EXPECT_EQ(count(html, R"(<img src="data:image/png;base64,)"), 4u);
  EXPECT_EQ(count(html, "src="), 4u) << "nothing but the inline images is loaded";
  EXPECT_EQ(count(html, "http"), 0u) << "no external resources";
  EXPECT_EQ(count(html, "<script"), 0u);
  for (const char* text : {"checkpoint-40", "--learning_rate", "a photo of &lt;cat-toy&gt;", "step 20", "step 40",
                           "sdtrain textual-inversion --seed=7", "2024-05-01T12:00:00Z"})
    EXPECT_NE(html.find(text), std::string::npos) << text;
}

TEST_F(ReportE2E, WorksWithoutRunJsonAndSkipsAHalfWrittenLastLine) {
  fs::remove(run_dir() / "logs" / "run.json");
  std::ofstream(run_dir() / "logs" / "metrics.jsonl", std::ios::app) << R"({"step": 61, "lo)";  // a crash mid-write
  const auto r = report();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string html = io::read_text_file(report_path());
  EXPECT_NE(html.find("flags unknown"), std::string::npos);
  EXPECT_NE(html.find(R"(<div class="value">60</div>)"), std::string::npos) << "the last whole step is 60";
}

TEST_F(ReportE2E, BadInputIsOneLineNamingTheFileAndLine) {
  const fs::path metrics = run_dir() / "logs" / "metrics.jsonl";
  std::string lines = io::read_text_file(metrics);
  lines.insert(lines.find('\n', lines.find('\n') + 1) + 1, "{\"step\": 3, oops}\n");  // becomes line 3
  io::write_text_file(metrics, lines);
  EXPECT_TRUE(sd::test::is_one_line_error(report(), metrics.string() + ":3: not valid JSON"));
  EXPECT_FALSE(fs::exists(report_path())) << "no report from bad input";

  io::write_text_file(metrics, "{\"loss\": 1}\n");
  EXPECT_TRUE(sd::test::is_one_line_error(report(), metrics.string() + ":1: expected a JSON object with an integer"));
  io::write_text_file(metrics, "\n");
  EXPECT_TRUE(sd::test::is_one_line_error(report(), metrics.string() + ": no metrics records"));
  fs::remove(metrics);
  EXPECT_TRUE(sd::test::is_one_line_error(report(), metrics.string() + ": metrics file not found"));
  EXPECT_TRUE(sd::test::is_one_line_error(run_command(sdtrain("report /nonexistent/run")),
                                          "/nonexistent/run: run folder not found"));
}

// Population variance of the pixels' luminance: 0 for a blank page.
double luminance_variance(const io::RgbImage& image) {
  double sum = 0, sum_squares = 0;
  const size_t n = image.pixels.size() / 3;
  for (size_t p = 0; p < n; ++p) {
    const uint8_t* rgb = &image.pixels[3 * p];
    const double y = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2];
    sum += y;
    sum_squares += y * y;
  }
  return sum_squares / n - (sum / n) * (sum / n);
}

TEST_F(ReportE2E, RendersInHeadlessChromium) {
  if (!sd::test::have_program("chromium")) GTEST_SKIP() << "chromium is not installed (scripts/setup-deps installs it)";
  ASSERT_EQ(report().exit_code, 0);
  // A fresh profile, and no network or background services: the page must render from the file alone.
  const auto chromium = [&](const std::string& action) {
    return sd::test::run_process(
        {"chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--user-data-dir=" + (dir_.path() / "profile").string(), "--window-size=1280,1600", action,
         "file://" + report_path().string()},
        std::chrono::seconds(120));
  };
  const fs::path screenshot = dir_.path() / "report.png";
  const auto shot = chromium("--screenshot=" + screenshot.string());
  ASSERT_EQ(shot.exit_code, 0) << shot.output;
  const io::RgbImage image = io::load_image_rgb(screenshot);
  EXPECT_EQ(image.width, 1280);
  EXPECT_GT(luminance_variance(image), 100) << "the screenshot looks blank";

  const auto dom = chromium("--dump-dom");
  ASSERT_EQ(dom.exit_code, 0) << dom.output;
  EXPECT_EQ(count(dom.output, R"(<svg class="chart")"), 4u);
  EXPECT_EQ(count(dom.output, R"(<path class="curve" d="M)"), 4u);
  EXPECT_EQ(count(dom.output, R"(<img src="data:image/png;base64,)"), 4u);
}

}  // namespace
}  // namespace sd
