// Stack dumps of ranks, for loomd's progress watchdog (DumpStacks -> StackDump). The supervisor
// sends SIGUSR1 to each live rank of the hung gang and captures, from its stderr, the lines
// between the dump's first and last lines (docs/rank-contract.md, "Stack dumps"); a rank that
// does not finish its dump within the wait is reported as not answering, with its process state
// from /proc (T: stopped, as by SIGSTOP; D: in an uninterruptible wait).
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "absl/time/time.h"

namespace loom::worker {

// The first and last lines of a dump (a prefix of each), as loom-train writes them.
inline constexpr std::string_view kStackDumpBegin = "loom-train: stack dump (SIGUSR1)";
inline constexpr std::string_view kStackDumpEnd = "loom-train: end of stack dump";
// The most text kept of one dump.
inline constexpr size_t kMaxStackDumpBytes = 16 * 1024;

// One rank's dump being captured.
struct StackDumpCapture {
  absl::Time deadline;
  bool capturing = false;  // the first line was seen
  std::string text;

  // Feeds one stderr line; returns true when it was the dump's last line.
  bool OnLine(std::string_view line);
};

// The state letter of /proc/<pid>/stat (R, S, D, T, t, Z, ...), or "?" when unreadable.
std::string ProcState(pid_t pid);

}  // namespace loom::worker
