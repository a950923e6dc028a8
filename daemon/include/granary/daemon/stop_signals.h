#pragma once

// How a daemon's main waits to be stopped: SIGTERM and SIGINT are blocked in
// the main thread before any other thread starts (so every thread inherits
// the mask and none is interrupted by them), then the main thread waits for
// one with sigwait and stops the daemon cleanly.
//
// Who calls it: DaemonMain (daemon_main.h), for every daemon's main.
//
// Thread safety: call BlockStopSignals from the main thread before starting
// threads; WaitForStopSignal from that thread.

#include <signal.h>

#include <string_view>

namespace granary {

// Blocks SIGTERM and SIGINT in the calling thread; returns the set.
sigset_t BlockStopSignals();

// Waits for a signal of `signals`; "SIGTERM" or "SIGINT".
std::string_view WaitForStopSignal(const sigset_t& signals);

}  // namespace granary
