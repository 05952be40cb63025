#include "worker/agent/rank_exit.h"

#include <string.h>
#include <sys/wait.h>

#include "absl/strings/str_cat.h"

namespace loom::worker {

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);  // thread-safe, unlike strsignal()
  if (abbrev == nullptr) return absl::StrCat("SIG", sig);
  return absl::StrCat("SIG", abbrev);
}

RankExit ClassifyExit(int wait_status, absl::string_view stop_reason,
                      absl::string_view last_stderr_line) {
  RankExit exit;
  if (WIFSIGNALED(wait_status)) {
    exit.exit_code = -1;
    exit.signal = WTERMSIG(wait_status);
    exit.exit_class = loom::v1::EXIT_CLASS_RETRYABLE;
    exit.message = absl::StrCat("killed by signal ", exit.signal, " (", SignalName(exit.signal),
                                ")");
  } else {
    exit.exit_code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
    exit.exit_class = exit.exit_code == 0   ? loom::v1::EXIT_CLASS_SUCCESS
                      : exit.exit_code == 2 ? loom::v1::EXIT_CLASS_PERMANENT
                                            : loom::v1::EXIT_CLASS_RETRYABLE;
    exit.message = absl::StrCat("exit code ", exit.exit_code);
  }
  if (!stop_reason.empty()) {
    exit.exit_class = loom::v1::EXIT_CLASS_STOPPED;
    exit.message = absl::StrCat("stopped (", stop_reason, "): ", exit.message);
  }
  if (!last_stderr_line.empty()) absl::StrAppend(&exit.message, ": ", last_stderr_line);
  return exit;
}

}  // namespace loom::worker
