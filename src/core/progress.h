// Progress of long work (step, loss, lr, speed, ETA). On a terminal: one line redrawn in place. Otherwise (a
// cluster job's log file, a pipe): a plain log line at most every SDTRAIN_PROGRESS_SECONDS seconds (default 60),
// so that a Slurm or Kubernetes log shows how far a run is without a line per step, and short runs print nothing.
// stdout never carries progress, only results.
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

 private:
  // "120/15000 2.31 s/it ETA 9:32:10 extra"
  std::string status(int64_t done, const std::string& extra) const;
  void log_line(int64_t done, const std::string& extra);

  std::string label_;
  int64_t total_;
  int64_t start_;
  bool terminal_;
  double log_every_s_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point began_, last_logged_;
  int64_t done_ = 0, logged_done_ = -1;  // the last update, and the last one logged (-1: none yet)
  std::string extra_;
};

// "1:02:03" or "02:03".
std::string format_duration(double seconds);

}  // namespace sd
