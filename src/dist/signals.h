// Graceful stop on SIGTERM/SIGINT (what Slurm, Kubernetes and Ctrl-C send before they kill): the handler only
// sets a flag; the training loop polls it and all ranks agree to stop at the same step.
#pragma once
#include "dist/communicator.h"

namespace sd::dist {

// Call once before the program starts any thread: blocks SIGTERM and SIGINT in the calling thread, so in every thread
// created later (they inherit the mask), and starts one idle thread that leaves them unblocked. The kernel then
// delivers them to that thread (or to OpenBLAS's pool thread, started when the library loaded and idle since sdtrain
// runs OpenBLAS single-threaded), so a handler or the default action never runs on a thread in the middle of a
// computation. That matters: oneDNN's JIT float32 GEMM kernels (the ones LibTorch 1.13 bundles) point
// the stack pointer into a heap workspace, so the kernel writes a signal frame over the GEMM's packed operands
// (oneDNN issue 4845, fixed in oneDNN 3.11.2). Before this routing 6 of 80 SIGTERMs that landed during a tiny
// textual-inversion step left a NaN gradient norm (0 of 80 after); damage that came out finite would have gone
// into the checkpoint written on the signal. Not for `launch`, which takes the signals itself with sigtimedwait.
void route_stop_signals_to_a_watcher_thread();

// Installs handlers for SIGTERM and SIGINT. The first signal sets the stop flag; a second one of the same kind, a
// second or more later, restores the default action and re-raises it, so an impatient user can still kill at once
// (one sooner is the echo of the first: `timeout` signals the process and then its group). Idempotent.
void install_stop_signal_handlers();
// Restores the default actions (for tests).
void uninstall_stop_signal_handlers();

bool stop_requested();
// The signal that requested the stop (0 if none, or if requested by request_stop()).
int stop_signal();
// Whether the handler of that signal ran on the main thread (whose thread id is the process id): never when the
// signals are routed to the watcher thread.
bool stop_signal_ran_on_main_thread();
// Programmatic stop (tests, or a rank deciding to stop on its own).
void request_stop();
void clear_stop_request();

// True on every rank if any rank requested a stop. A collective: every rank must call it at the same point
// (e.g. once per optimizer step), so all stop after the same step.
bool any_rank_stopping(Communicator& comm);
// The signal that stops this run: this rank's, else the first signalled rank's (learned by any_rank_stopping), else
// 0. A rank exits with 128 + it, so a run whose one rank got SIGINT exits 130 on every rank.
int run_stop_signal();

}  // namespace sd::dist
