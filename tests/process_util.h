// Child processes for tests that never hang: each runs in its own process group with its output in a file, and
// is killed (the whole group) when its deadline passes.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace sd::test {

class Process {
 public:
  // Starts argv[0] (looked up in PATH) with the current environment plus `env` (a value of "\x01unset" removes
  // the variable). stdout and stderr go to one file, readable with output().
  Process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {});
  ~Process();  // kills the process group if still running
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  // Waits until the process ends or `deadline` (from now) passes; then kills its group and returns false.
  bool wait(std::chrono::milliseconds deadline);
  bool running();
  void signal(int sig);        // to the process only
  void signal_group(int sig);  // to its process group
  // Exit code, or 128 + signal number; -1 while running.
  int exit_code() const { return exit_code_; }
  bool timed_out() const { return timed_out_; }
  // Seconds from start to exit (or to the kill).
  double seconds() const { return seconds_; }
  std::string output() const;
  // Waits until output() contains `text` (true) or the deadline passes / the process ends without it (false).
  bool wait_for_output(const std::string& text, std::chrono::milliseconds deadline);

 private:
  friend bool wait_all(const std::vector<Process*>&, std::chrono::milliseconds);
  bool reap(bool block);
  pid_t pid_ = -1;
  int exit_code_ = -1;
  bool timed_out_ = false;
  double seconds_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::filesystem::path output_path_;
};

// Waits for all, reaping each as it ends (so each seconds() is its own exit time); kills the rest at the deadline.
// True if all ended in time.
bool wait_all(const std::vector<Process*>& processes, std::chrono::milliseconds deadline);

struct ProcessResult {
  int exit_code;
  bool timed_out;
  double seconds;
  std::string output;
};

// Runs one process to completion or deadline.
ProcessResult run_process(const std::vector<std::string>& argv, std::chrono::milliseconds deadline,
                          const std::map<std::string, std::string>& env = {});

// `command` (sdtrain and its arguments) run as `ranks` local ranks by `sdtrain launch`.
std::vector<std::string> under_launch(int ranks, const std::vector<std::string>& command);

// True if `program` is found in PATH.
bool have_program(const std::string& program);

}  // namespace sd::test
