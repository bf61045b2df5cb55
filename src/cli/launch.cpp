// `sdtrain launch --nproc_per_node K -- <subcommand ...>`: K ranks on this machine without an MPI install, with
// torchrun-style variables. Forwards SIGINT/SIGTERM; when one rank fails, stops the rest and exits with its code.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/rendezvous.h"
#include "dist/store_listen.h"

namespace sd::cli {
namespace {

struct LaunchOptions {
  int nproc_per_node = 1;
  int master_port = 0;
  double grace_period = 10;
  std::vector<std::string> command;
  std::vector<std::string> known_commands;  // sdtrain's subcommands: a typo fails once, before any rank starts
};

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "ended";
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

int run_launch(const LaunchOptions& o) {
  SD_CHECK(o.nproc_per_node >= 1 && o.nproc_per_node <= 1024, "--nproc_per_node must be in 1..1024, got {}",
           o.nproc_per_node);
  SD_CHECK(o.master_port >= 0 && o.master_port <= 65535, "--master_port must be a port number, got {}", o.master_port);
  SD_CHECK(o.grace_period >= 0, "--grace_period must be >= 0 seconds, got {}", o.grace_period);
  SD_CHECK(!o.command.empty(), "launch: no subcommand given: sdtrain launch --nproc_per_node 2 -- <subcommand ...>");
  SD_CHECK(o.command.front() != "launch", "launch: the launched subcommand cannot be launch itself");
  SD_CHECK(std::find(o.known_commands.begin(), o.known_commands.end(), o.command.front()) != o.known_commands.end(),
           "launch: unknown command '{}' (expected one of: {})", o.command.front(), fmt::join(o.known_commands, ", "));
  const int port = o.master_port ? o.master_port : dist::find_free_port();
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();

  // Signals are taken synchronously with sigtimedwait: blocked from before the first fork, so none is lost.
  sigset_t handled;
  sigemptyset(&handled);
  for (int s : {SIGINT, SIGTERM, SIGCHLD, SIGHUP}) sigaddset(&handled, s);
  sigset_t previous;
  sigprocmask(SIG_BLOCK, &handled, &previous);

  // Arguments and environments are built before forking: a forked child may only make async-signal-safe calls.
  std::vector<std::string> args{exe};
  args.insert(args.end(), o.command.begin(), o.command.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::vector<std::string>> env_entries(o.nproc_per_node);
  std::vector<std::vector<char*>> envs(o.nproc_per_node);
  for (int k = 0; k < o.nproc_per_node; ++k) {
    auto env = dist::current_environment();
    env["RANK"] = std::to_string(k);
    env["WORLD_SIZE"] = std::to_string(o.nproc_per_node);
    env["LOCAL_RANK"] = std::to_string(k);
    env["LOCAL_WORLD_SIZE"] = std::to_string(o.nproc_per_node);
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = std::to_string(port);
    env["SDTRAIN_LAUNCH"] = "1";
    for (const auto& [key, value] : env) env_entries[k].push_back(key + "=" + value);
    for (auto& e : env_entries[k]) envs[k].push_back(e.data());
    envs[k].push_back(nullptr);
  }

  const pid_t launcher_pid = getpid();
  std::map<pid_t, int> live;  // pid -> local rank
  std::fflush(nullptr);
  for (int k = 0; k < o.nproc_per_node; ++k) {
    pid_t pid = fork();
    if (pid < 0) {
      for (auto& [p, r] : live) kill(p, SIGKILL);
      fail("launch: fork failed for local rank {}: {}", k, std::strerror(errno));
    }
    if (pid == 0) {
      // Own process group: a terminal's Ctrl-C reaches the ranks once, through the launcher, not twice (which the
      // ranks would take as "stop now"). If the launcher dies, the ranks get SIGTERM instead of living on.
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != launcher_pid) _exit(1);
      sigprocmask(SIG_SETMASK, &previous, nullptr);
      execve(exe.c_str(), argv.data(), envs[k].data());
      const char msg[] = "sdtrain launch: cannot execute /proc/self/exe\n";
      (void)!write(2, msg, sizeof msg - 1);
      _exit(127);
    }
    live[pid] = k;
  }

  using Clock = std::chrono::steady_clock;
  std::optional<int> failure_code;
  std::optional<int> forwarded;  // the stop signal passed on to the ranks
  bool kill_pending = false;
  Clock::time_point kill_at{};
  auto signal_all = [&](int sig) {
    for (auto& [pid, rank] : live) kill(pid, sig);
  };
  while (!live.empty()) {
    timespec wait_for{0, 200 * 1000 * 1000};
    siginfo_t info;
    int sig = sigtimedwait(&handled, &info, &wait_for);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      forwarded = sig == SIGHUP ? SIGTERM : sig;
      signal_all(*forwarded);
    }
    // Reap everything that ended (SIGCHLD may coalesce, so also on every wakeup).
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      auto it = live.find(pid);
      if (it == live.end()) continue;
      int rank = it->second;
      live.erase(it);
      if (exit_code(status) != 0 && !failure_code) {
        failure_code = exit_code(status);
        // A rank that stopped on the signal passed on to it did what it was asked; the others are stopping too.
        if (forwarded && exit_code(status) == 128 + *forwarded) continue;
        std::fprintf(stderr, "sdtrain launch: local rank %d (pid %d) %s; stopping the other %zu rank(s)\n", rank,
                     static_cast<int>(pid), describe_status(status).c_str(), live.size());
        std::fflush(stderr);
        signal_all(SIGTERM);
        kill_pending = true;
        kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.grace_period * 1000));
      }
    }
    if (kill_pending && Clock::now() >= kill_at && !live.empty()) {
      std::fprintf(stderr, "sdtrain launch: %zu rank(s) still running %g s after SIGTERM; sending SIGKILL\n",
                   live.size(), o.grace_period);
      signal_all(SIGKILL);
      kill_pending = false;
    }
  }
  sigprocmask(SIG_SETMASK, &previous, nullptr);
  return failure_code.value_or(0);
}

}  // namespace

void add_launch(CLI::App& app, std::function<int()>& chosen) {
  auto o = std::make_shared<LaunchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "launch",
      "Run K ranks of an sdtrain subcommand on this machine (torchrun-style RANK/WORLD_SIZE/LOCAL_RANK/"
      "LOCAL_WORLD_SIZE/MASTER_ADDR/MASTER_PORT). Example: sdtrain launch --nproc_per_node 2 -- dist-check");
  cmd->add_option("--nproc_per_node,--nproc-per-node", o->nproc_per_node, "Ranks to start on this machine")
      ->capture_default_str();
  cmd->add_option("--master_port,--master-port", o->master_port,
                  "Port of the rendezvous store on 127.0.0.1 (0: pick a free port)")
      ->capture_default_str();
  cmd->add_option("--grace_period,--grace-period", o->grace_period,
                  "Seconds between SIGTERM and SIGKILL for the other ranks when one fails")
      ->capture_default_str();
  cmd->add_option("command", o->command, "The subcommand and its flags, after --")->required();
  cmd->callback([o, &chosen, &app] {
    for (const CLI::App* sub : app.get_subcommands({})) o->known_commands.push_back(sub->get_name());
    chosen = [o] { return run_launch(*o); };
  });
}

}  // namespace sd::cli
