#include "granary/daemon/stop_signals.h"

#include <pthread.h>

namespace granary {

sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

std::string_view WaitForStopSignal(const sigset_t& signals) {
  int signal_number = 0;
  while (sigwait(&signals, &signal_number) != 0) {
  }
  return signal_number == SIGTERM ? "SIGTERM" : "SIGINT";
}

}  // namespace granary
