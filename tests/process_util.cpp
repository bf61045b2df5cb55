#include "process_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace sd::test {

namespace {
std::filesystem::path new_output_path() {
  static std::atomic<int> counter{0};
  return std::filesystem::temp_directory_path() /
         ("sdtrain-proc-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ".log");
}
}  // namespace

Process::Process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env)
    : start_(std::chrono::steady_clock::now()), output_path_(new_output_path()) {
  if (argv.empty()) throw std::invalid_argument("Process: empty argv");
  int fd = open(output_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("Process: cannot create " + output_path_.string());
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  // The environment is built before fork: only async-signal-safe calls are allowed in a forked child of a
  // multi-threaded process.
  std::map<std::string, std::string> merged;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    if (eq != std::string::npos) merged[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [k, v] : env) {
    if (v == "\x01unset")
      merged.erase(k);
    else
      merged[k] = v;
  }
  std::vector<std::string> env_entries;
  for (const auto& [k, v] : merged) env_entries.push_back(k + "=" + v);
  std::vector<char*> cenv;
  for (auto& e : env_entries) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  pid_ = fork();
  if (pid_ < 0) {
    close(fd);
    throw std::runtime_error(std::string("Process: fork failed: ") + std::strerror(errno));
  }
  if (pid_ == 0) {
    setpgid(0, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    // gtest may have blocked or ignored signals; a child starts clean.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD}) ::signal(s, SIG_DFL);
    execvpe(cargv[0], cargv.data(), cenv.data());
    const char msg[] = "Process: exec failed\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(127);
  }
  setpgid(pid_, pid_);  // also from the parent, so signal_group works even before the child ran
  close(fd);
}

Process::~Process() {
  if (exit_code_ < 0 && pid_ > 0) {
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);
    reap(true);
  }
  std::error_code ignored;
  std::filesystem::remove(output_path_, ignored);
}

bool Process::reap(bool block) {
  if (exit_code_ >= 0) return true;
  int status = 0;
  pid_t r = waitpid(pid_, &status, block ? 0 : WNOHANG);
  if (r != pid_) return false;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return true;
}

bool Process::running() { return !reap(false); }

bool Process::wait(std::chrono::milliseconds deadline) {
  auto until = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < until) {
    if (reap(false)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (reap(false)) return true;
  timed_out_ = true;
  kill(-pid_, SIGKILL);
  kill(pid_, SIGKILL);
  reap(true);
  return false;
}

void Process::signal(int sig) {
  if (exit_code_ < 0) kill(pid_, sig);
}

void Process::signal_group(int sig) {
  if (exit_code_ < 0) kill(-pid_, sig);
}

std::string Process::output() const {
  std::ifstream in(output_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool Process::wait_for_output(const std::string& text, std::chrono::milliseconds deadline) {
  auto until = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < until) {
    if (output().find(text) != std::string::npos) return true;
    if (!running()) return output().find(text) != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

bool wait_all(const std::vector<Process*>& processes, std::chrono::milliseconds deadline) {
  auto until = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < until) {
    bool all = true;
    for (auto* p : processes) all = p->reap(false) && all;
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  bool all = true;
  for (auto* p : processes) all = p->wait(std::chrono::milliseconds(0)) && all;
  return all;
}

ProcessResult run_process(const std::vector<std::string>& argv, std::chrono::milliseconds deadline,
                          const std::map<std::string, std::string>& env) {
  Process p(argv, env);
  p.wait(deadline);
  return {p.exit_code(), p.timed_out(), p.seconds(), p.output()};
}

bool have_program(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':'))
    if (!dir.empty() && access((dir + "/" + program).c_str(), X_OK) == 0) return true;
  return false;
}

std::vector<std::string> under_launch(int ranks, const std::vector<std::string>& command) {
  std::vector<std::string> args = {command.at(0), "launch", "--nproc_per_node", std::to_string(ranks), "--"};
  args.insert(args.end(), command.begin() + 1, command.end());
  return args;
}

}  // namespace sd::test
