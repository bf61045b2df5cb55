// Graceful stop on SIGTERM/SIGINT (what Slurm, Kubernetes and Ctrl-C send before they kill): the handler only
// sets a flag; the training loop polls it and all ranks agree to stop at the same step.
#pragma once
#include "dist/communicator.h"

namespace sd::dist {

// Installs handlers for SIGTERM and SIGINT. The first signal sets the stop flag; a second one of the same kind
// restores the default action and re-raises it, so an impatient user can still kill at once. Idempotent.
void install_stop_signal_handlers();
// Restores the default actions (for tests).
void uninstall_stop_signal_handlers();

bool stop_requested();
// The signal that requested the stop (0 if none, or if requested by request_stop()).
int stop_signal();
// Programmatic stop (tests, or a rank deciding to stop on its own).
void request_stop();
void clear_stop_request();

// True on every rank if any rank requested a stop. A collective: every rank must call it at the same point
// (e.g. once per optimizer step), so all stop after the same step.
bool any_rank_stopping(Communicator& comm);

}  // namespace sd::dist
