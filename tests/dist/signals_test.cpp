// Stop signals: the first SIGTERM/SIGINT only sets the flag; a second one of the same kind, a second or more later,
// ends the process.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dist/signals.h"

namespace sd::dist {
namespace {

TEST(StopSignals, FirstSignalSetsTheFlag) {
  clear_stop_request();
  install_stop_signal_handlers();
  EXPECT_FALSE(stop_requested());
  raise(SIGTERM);  // handled: the test process keeps running
  EXPECT_TRUE(stop_requested());
  EXPECT_EQ(stop_signal(), SIGTERM);
  clear_stop_request();
  raise(SIGINT);
  EXPECT_TRUE(stop_requested());
  EXPECT_EQ(stop_signal(), SIGINT);
  uninstall_stop_signal_handlers();
  clear_stop_request();
  request_stop();
  EXPECT_TRUE(stop_requested());
  EXPECT_EQ(stop_signal(), 0);
  clear_stop_request();
}

TEST(StopSignals, TheSameSignalAgainAtOnceIsOneRequest) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Only async-signal-safe calls in the forked child.
    install_stop_signal_handlers();
    raise(SIGINT);
    raise(SIGINT);  // as `timeout` sends it: to the process, then to its group
    _exit(stop_signal() == SIGINT ? 7 : 2);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 7);
}

// With the signals routed to the watcher thread, a process-directed SIGTERM (what kill, Slurm and Kubernetes send)
// runs the handler there, never on the main thread, and a later second one still ends the process.
TEST(StopSignals, RoutedSignalsRunOnTheWatcherAndALaterSecondStillKills) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    clear_stop_request();
    route_stop_signals_to_a_watcher_thread();
    install_stop_signal_handlers();
    kill(getpid(), SIGTERM);
    for (int i = 0; i < 5000 && !stop_requested(); ++i) usleep(1000);
    if (!stop_requested()) _exit(2);
    if (stop_signal_ran_on_main_thread()) _exit(3);
    usleep(1'100'000);  // past the echo window
    kill(getpid(), SIGTERM);
    for (int i = 0; i < 5000; ++i) usleep(1000);
    _exit(4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit code " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
}

}  // namespace
}  // namespace sd::dist
