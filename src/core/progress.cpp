#include "core/progress.h"

#include <unistd.h>

#include <cstdio>
#include <fmt/format.h>

namespace sd {

ProgressBar::ProgressBar(std::string label, int64_t total, int64_t start)
    : label_(std::move(label)),
      total_(total),
      start_(start),
      enabled_(isatty(STDERR_FILENO) != 0),
      began_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() { finish(); }

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{:02}:{:02}", s / 60, s % 60);
}

void ProgressBar::update(int64_t done, const std::string& extra) {
  if (!enabled_) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - began_).count();
  const int64_t progressed = done - start_;
  const double per_step = progressed > 0 ? elapsed / progressed : 0.0;
  constexpr int kWidth = 24;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : 0;
  std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
  std::string timing;  // none until a step has been timed since the bar began
  if (progressed > 0) {
    const std::string rate =
        per_step >= 1.0 ? fmt::format("{:.2f} s/it", per_step) : fmt::format("{:.2f} it/s", 1.0 / per_step);
    timing = fmt::format(" {} ETA {}", rate, format_duration(per_step * static_cast<double>(total_ - done)));
  }
  std::fprintf(stderr, "\r\033[K%s [%s] %lld/%lld%s %s", label_.c_str(), bar.c_str(), static_cast<long long>(done),
               static_cast<long long>(total_), timing.c_str(), extra.c_str());
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  std::fprintf(stderr, "\n");
}

}  // namespace sd
