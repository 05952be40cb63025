// Stop requests: loom-worker sends SIGUSR2 to a rank when its gang must stop with its work kept
// (the node drains: the worker is stopping, or an operator drained it; docs/rank-contract.md).
// The rank finishes the step it is in, every rank of the gang agrees on that step (the flag
// travels in the step's world all-reduce, so all ranks see it at the same step), they save a
// checkpoint there, and exit with kExitStopped. SIGTERM still stops a rank at once (cancel,
// a failed peer): there is no step to agree on when a peer is gone.
//
// The handler only sets a flag (async-signal-safe); the training loop reads it.
#ifndef LOOM_WORKER_TRAIN_DIAG_STOP_REQUEST_H_
#define LOOM_WORKER_TRAIN_DIAG_STOP_REQUEST_H_

namespace loom::train {

// Installs the SIGUSR2 handler. Call once from the main thread, before other threads start.
void InstallStopRequestHandler();

// Whether SIGUSR2 arrived since the process started (or since the handler was installed).
// Thread-safe; never blocks.
bool StopRequested();

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_DIAG_STOP_REQUEST_H_
