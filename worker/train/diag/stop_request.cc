#include "worker/train/diag/stop_request.h"

#include <csignal>

namespace loom::train {
namespace {

// Process-wide because a signal handler can reach nothing else; written only by the handler.
volatile std::sig_atomic_t g_stop_requested = 0;

void OnStopRequest(int) { g_stop_requested = 1; }

}  // namespace

void InstallStopRequestHandler() {
  struct sigaction action = {};
  action.sa_handler = &OnStopRequest;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a read or write in progress goes on: the step finishes
  sigaction(SIGUSR2, &action, nullptr);
}

bool StopRequested() { return g_stop_requested != 0; }

}  // namespace loom::train
