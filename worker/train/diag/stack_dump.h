// Stack dumps on request: loom-worker sends SIGUSR1 to a rank when loomd's progress watchdog
// finds its job hung (docs/rank-contract.md). The handler writes, on stderr (which the worker
// captures into the job's logs and into its StackDump answer):
//
//   loom-train: stack dump (SIGUSR1), pid 1234
//   <the main thread's backtrace, one frame a line>
//   last collectives: all_reduce #12, reduce_scatter #0, ...
//   loom-train: end of stack dump
//
// The signal may land on any thread (Gloo's and the comm thread's included); the handler
// forwards it to the main thread (the training loop, where a hang shows) and dumps there.
// Everything in the handler is async-signal-safe except the backtrace, whose library is loaded
// at install time so that the handler's call does not allocate. The process keeps running.
#ifndef LOOM_WORKER_TRAIN_DIAG_STACK_DUMP_H_
#define LOOM_WORKER_TRAIN_DIAG_STACK_DUMP_H_

namespace loom::train {

// Installs the SIGUSR1 handler. Call once from the main thread, before other threads start.
void InstallStackDumpHandler();

// The first and last lines of a dump, which the worker looks for.
inline constexpr char kStackDumpBegin[] = "loom-train: stack dump (SIGUSR1)";
inline constexpr char kStackDumpEnd[] = "loom-train: end of stack dump";

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_DIAG_STACK_DUMP_H_
