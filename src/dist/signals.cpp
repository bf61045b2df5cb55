#include "dist/signals.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <ctime>
#include <thread>

namespace sd::dist {
namespace {

// Lock-free atomics are async-signal-safe; std::atomic<int> is lock-free on every platform we build for.
std::atomic<int> g_stop_signal{0};
std::atomic<bool> g_stop{false};
std::atomic<int> g_stop_signal_thread{0};    // the kernel's id of the thread that ran the handler
std::atomic<int> g_signal_of_other_rank{0};  // the signal that stopped another rank, learned in any_rank_stopping
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free);

std::atomic<int64_t> g_stop_signal_ns{0};  // CLOCK_MONOTONIC time of the first signal
static_assert(std::atomic<int64_t>::is_always_lock_free);

// `timeout` signals its child and then the child's process group, and Slurm may signal both the step's processes
// and their group: the same signal twice within milliseconds, which is one request, not a user insisting.
constexpr int64_t kEchoWindowNs = 1'000'000'000;

int64_t monotonic_ns() {  // clock_gettime is async-signal-safe
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal.load() == sig) {
    if (monotonic_ns() - g_stop_signal_ns.load() < kEchoWindowNs) return;
    // Second time: the user insists. signal() and raise() are async-signal-safe.
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop_signal_thread.store(static_cast<int>(gettid()));  // a system call: async-signal-safe
  g_stop_signal_ns.store(monotonic_ns());
  g_stop_signal.store(sig);
  g_stop.store(true);
}

void set_handler(int sig, void (*handler)(int)) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  // Restart interrupted reads/writes: the flag is polled, nothing needs EINTR.
  sa.sa_flags = SA_RESTART;
  sigaction(sig, &sa, nullptr);
}

}  // namespace

void route_stop_signals_to_a_watcher_thread() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  std::thread([stop] {
    pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
    // The handlers run here; the second-signal re-raise in on_stop_signal is delivered here too, and kills.
    for (;;) pause();
  }).detach();
}

void install_stop_signal_handlers() {
  set_handler(SIGTERM, on_stop_signal);
  set_handler(SIGINT, on_stop_signal);
}

void uninstall_stop_signal_handlers() {
  set_handler(SIGTERM, SIG_DFL);
  set_handler(SIGINT, SIG_DFL);
}

bool stop_requested() { return g_stop.load(); }
int stop_signal() { return g_stop_signal.load(); }
bool stop_signal_ran_on_main_thread() { return g_stop_signal_thread.load() == static_cast<int>(getpid()); }
void request_stop() { g_stop.store(true); }
void clear_stop_request() {
  g_stop.store(false);
  g_stop_signal.store(0);
  g_signal_of_other_rank.store(0);
}

bool any_rank_stopping(Communicator& comm) {
  // Each rank's signal (-1: a stop without one), so that every rank can exit as the signalled one does.
  const std::vector<int64_t> requests = comm.all_gather({stop_requested() ? (stop_signal() ? stop_signal() : -1) : 0});
  bool stopping = false;
  for (int64_t request : requests) {
    if (request > 0 && g_signal_of_other_rank.load() == 0) g_signal_of_other_rank.store(static_cast<int>(request));
    stopping = stopping || request != 0;
  }
  return stopping;
}

int run_stop_signal() { return stop_signal() ? stop_signal() : g_signal_of_other_rank.load(); }

}  // namespace sd::dist
