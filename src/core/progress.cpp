#include "core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "core/log.h"

namespace sd {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// SDTRAIN_PROGRESS_SECONDS: how often a log (not a terminal) gets a progress line; unset or not a positive number:
// every minute.
double log_interval_from_environment() {
  const char* v = std::getenv("SDTRAIN_PROGRESS_SECONDS");
  if (!v) return 60;
  char* end = nullptr;
  const double seconds = std::strtod(v, &end);
  return end != v && *end == '\0' && seconds > 0 ? seconds : 60;
}

}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total, int64_t start)
    : label_(std::move(label)),
      total_(total),
      start_(start),
      terminal_(isatty(STDERR_FILENO) != 0),
      log_every_s_(log_interval_from_environment()),
      began_(Clock::now()),
      last_logged_(began_),
      done_(start) {}

ProgressBar::~ProgressBar() { finish(); }

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{:02}:{:02}", s / 60, s % 60);
}

std::string ProgressBar::status(int64_t done, const std::string& extra) const {
  const int64_t progressed = done - start_;
  std::string timing;  // none until a step has been timed since the bar began
  if (progressed > 0) {
    const double per_step = seconds_since(began_) / static_cast<double>(progressed);
    const std::string rate =
        per_step >= 1.0 ? fmt::format("{:.2f} s/it", per_step) : fmt::format("{:.2f} it/s", 1.0 / per_step);
    timing = fmt::format(" {} ETA {}", rate, format_duration(per_step * static_cast<double>(total_ - done)));
  }
  return fmt::format("{}/{}{} {}", done, total_, timing, extra);
}

void ProgressBar::log_line(int64_t done, const std::string& extra) {
  const int percent = total_ > 0 ? static_cast<int>(100 * done / total_) : 0;
  log::info("{} {}% {}", label_, percent, status(done, extra));
  last_logged_ = Clock::now();
  logged_done_ = done;
}

void ProgressBar::update(int64_t done, const std::string& extra) {
  done_ = done;
  extra_ = extra;
  if (!terminal_) {
    if (seconds_since(last_logged_) >= log_every_s_) log_line(done, extra);
    return;
  }
  constexpr int kWidth = 24;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : 0;
  const std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
  std::fprintf(stderr, "\r\033[K%s [%s] %s", label_.c_str(), bar.c_str(), status(done, extra).c_str());
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (terminal_)
    std::fprintf(stderr, "\n");
  else if (logged_done_ >= 0 && logged_done_ != done_)
    log_line(done_, extra_);  // a log that showed progress also shows where it ended
}

}  // namespace sd
