// Launcher: starts one rank process the way docs/rank-contract.md requires.
//
// The child gets: its own process group (setpgid(0, 0), so the supervisor can signal the rank
// and everything it forks at once); PR_SET_PDEATHSIG=SIGKILL (if the worker dies, even by
// SIGKILL, the rank dies too — no orphans); an empty signal mask and default dispositions (the
// worker blocks SIGTERM/SIGINT for its signal thread, and a blocked or ignored signal would
// survive exec); stdin from /dev/null; stdout, stderr and the progress fd (3) on pipes whose read
// ends the caller gets; no other inherited descriptor; the given working directory and exactly
// the given environment; and, when asked, the given user, group and supplementary groups.
//
// Exec failure is reported through the memory the child shares with the worker until it execs:
// a step that fails writes the step and errno there and exits. CLONE_VFORK resumes the
// launching thread only once the child has exec'd or exited, so Launch() returns only after the
// rank program is running (or has failed to start), and then the report is complete. (A pipe
// closed on exec did the same at the cost of a pipe, a read and two closes per rank.)
//
// The child is a clone that shares the worker's address space until it execs (CLONE_VM |
// CLONE_VFORK, as posix_spawn does), not a fork: the worker's page tables are not copied (on a
// 2-core VM the gap between two back-to-back 8-rank gangs fell from 11.0 to 6.5 ms with this
// alone; docs/benchmarks.md). Between the clone and the exec the child makes only system calls
// on data prepared before the clone, and writes no memory of the worker's.
//
// Threading: Launch() may be called from any thread, but the death signal fires when the
// *thread* that started the child exits, so callers launch from a thread that lives as long as
// the ranks (the supervisor's loop thread and its LaunchPool's). That thread is suspended from the
// clone until the child has exec'd or failed.
#pragma once

#include <sys/types.h>

#include <csignal>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::worker {

struct LaunchRequest {
  std::string program;            // an absolute path (not searched in PATH)
  std::vector<std::string> args;  // argv[1..]; argv[0] is `program`
  std::map<std::string, std::string> env;
  std::string cwd;
  // When switch_user, the child drops to this identity first: setgroups(groups), setgid(gid),
  // setuid(uid), in that order, before arming PR_SET_PDEATHSIG (a change of credentials clears
  // it). A failure is reported like an exec failure.
  bool switch_user = false;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
};

// The signals whose disposition differs from the default in this process: ignored ones (an
// ignore survives exec, and a rank must start with defaults) and handled ones (a handler must
// not run on the child's stack between the child's unblocking of signals and its exec). Taken
// once per gang by the caller (LaunchPool) so that each child resets only these instead of
// asking for all 64: in a worker, SIGPIPE (which it ignores) and whatever it was started with
// ignored (a shell's background job: SIGINT and SIGQUIT), so 1 to 3 system calls instead of 62.
// A disposition changed after the snapshot would be missed: the worker sets its dispositions at
// start, before it launches anything.
struct SignalSnapshot {
  int count = 0;
  int signals[NSIG] = {};
};
SignalSnapshot NonDefaultSignals();

// A started rank. The caller owns the fds (read ends, non-blocking, close-on-exec) and must reap
// `pid` with waitpid(). pid is also the process group id.
struct LaunchedProcess {
  pid_t pid = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  int progress_fd = -1;
  // The worker's end of the fence (a Unix socket pair; non-blocking, close-on-exec), whose other
  // end the rank has as fd 5 (LOOM_FENCE_FD): the worker writes a byte about every second, and a
  // rank that hears nothing for LOOM_FENCE_TIMEOUT_MS stops itself (its worker is frozen or
  // gone).
  int fence_fd = -1;
};

// A stack for the clone's child, mapped once and reused by every Launch() of one thread:
// CLONE_VFORK keeps the launching thread suspended until the child has exec'd or exited, so the
// stack is free again when Launch() returns. (Mapping one per launch cost a munmap each, which
// in a multi-threaded process flushes the TLB of every core: about 5 % of the worker's CPU with
// back-to-back gangs.) Not thread-safe: one thread's.
class ChildStack {
 public:
  ChildStack();
  ~ChildStack();
  ChildStack(const ChildStack&) = delete;
  ChildStack& operator=(const ChildStack&) = delete;
  // The stack's highest address (stacks grow down), or null when the mapping failed (then
  // Launch() maps one of its own).
  char* top() const;

 private:
  void* base_ = nullptr;
};

// Starts the program, on `stack` when given (the calling thread's own). Errors:
//   FAILED_PRECONDITION — the program could not be executed (missing, not executable, bad
//     working directory, the user could not be switched); the message names the step and the
//     errno text, e.g.
//     "exec /x/loom-train: No such file or directory". Restarting cannot help: permanent.
//   RESOURCE_EXHAUSTED / INTERNAL — pipe() or fork() failed (out of processes or fds): the node's
//     trouble, worth a retry.
// `signals`: the dispositions the child resets (NonDefaultSignals()); null resets every signal.
absl::StatusOr<LaunchedProcess> Launch(const LaunchRequest& request, ChildStack* stack = nullptr,
                                       const SignalSnapshot* signals = nullptr);

// Thread-safe strerror.
std::string ErrnoText(int err);

}  // namespace loom::worker
