// How a rank's end is classified and described, per docs/rank-contract.md:
//   exit 0                      -> SUCCESS
//   exit 2                      -> PERMANENT (bad configuration or input)
//   any other exit, any signal  -> RETRYABLE
//   ended after the worker asked it to stop (cancel, gang stop, shutdown) -> STOPPED,
//     whatever the exit status, because the failure is not the rank's.
// Threading: pure functions, thread-safe.
#pragma once

#include <string>
#include "absl/strings/string_view.h"

#include "loom/v1/node.pb.h"

namespace loom::worker {

struct RankExit {
  // The exit code, or -1 when the process was killed by a signal.
  int exit_code = 0;
  // The signal that killed the process, or 0.
  int signal = 0;
  loom::v1::ExitClass exit_class = loom::v1::EXIT_CLASS_UNSPECIFIED;
  // "exit code 3: <last stderr line>", "killed by signal 9 (SIGKILL)", "stopped (...): ...".
  std::string message;
};

// `wait_status` is what waitpid() returned; `stop_reason` is non-empty when the worker had asked
// the rank to stop before it ended; `last_stderr_line` (may be empty) is appended to the message.
RankExit ClassifyExit(int wait_status, absl::string_view stop_reason,
                      absl::string_view last_stderr_line);

// "SIGKILL" for 9, "SIG34" for a signal without a name.
std::string SignalName(int sig);

}  // namespace loom::worker
