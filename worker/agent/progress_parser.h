// Parses the progress lines a rank writes on LOOM_PROGRESS_FD (docs/rank-contract.md) into
// StepReports for loomd.
//
// A line is one JSON object. Events "step" and "eval" become a StepReport; other events
// ("checkpoint", future ones) are recognised and skipped. Unknown fields are ignored. Anything
// else (not JSON, not an object, no "event", a field of the wrong type, a number out of range)
// is an error the caller logs before skipping the line: a rank can never crash the worker with
// what it prints.
//
// The report's job, generation and rank are filled by the caller from what the worker knows,
// never from the line (a rank cannot report for another).
//
// Threading: pure function, thread-safe.
#pragma once

#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "loom/v1/node.pb.h"

namespace loom::worker {

// Returns the report for a "step" or "eval" line, std::nullopt for a well-formed line of another
// event, and INVALID_ARGUMENT (naming the field) for a malformed line.
absl::StatusOr<std::optional<loom::v1::StepReport>> ParseProgressLine(std::string_view line);

}  // namespace loom::worker
