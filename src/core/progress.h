// A one-line progress bar on a terminal (step, loss, lr, speed, ETA), silent when stderr is not a terminal, so a
// pipe carries nothing but results.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace sd {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, int64_t start = 0);
  ~ProgressBar();
  // Moves to `done` steps; `extra` (e.g. "loss 0.123 lr 2e-3") is shown after the counters.
  void update(int64_t done, const std::string& extra = "");
  void finish();
  bool enabled() const { return enabled_; }

 private:
  std::string label_;
  int64_t total_;
  int64_t start_;
  bool enabled_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point began_;
};

// "1:02:03" or "02:03".
std::string format_duration(double seconds);

}  // namespace sd
