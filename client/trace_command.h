// `loomctl trace JOB [--steps A:B] [-o FILE]`: every rank's phases of a running job over a
// step range, written as a Chrome trace-event file that Perfetto opens (client/trace_json.h,
// docs/trace.md). loomd fetches the events from the ranks' trace rings through their workers
// (GetJobTrace).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/commands.h"

namespace loom::client {

// The most steps one trace covers (loomd's JobManager::kMaxTraceSteps).
inline constexpr int64_t kMaxTraceSteps = 64;

struct StepRange {
  int64_t first = 0;  // both 0: loomd's default, the last steps rank 0 reported
  int64_t last = 0;
};

// "A:B" (1 <= A <= B, at most kMaxTraceSteps steps) or "A" (one step); INVALID_ARGUMENT naming
// --steps and the fix otherwise. An empty text is the default range.
absl::StatusOr<StepRange> ParseStepRange(absl::string_view text);

struct TraceArgs {
  std::string job;
  std::string steps;                // --steps, "" for the default
  std::string file = "trace.json";  // -o/--output; "-" for standard output
  // --wait: seconds to wait for a job that is not RUNNING yet, or has not run past the last
  // step of the range, before asking for the trace (0: ask at once).
  double wait_seconds = 120;
};

// Fetches the trace and writes the file, then prints one summary line (ranks, events, steps,
// the file) on `out` (on `err` when the file is standard output) and each note or silent node
// on `err`. Exit codes as every command (exit_codes.h); 1 when the file cannot be written.
int RunTrace(CommandContext& ctx, const TraceArgs& args);

}  // namespace loom::client
