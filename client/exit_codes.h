// loomctl's exit codes, the contract scripts rely on:
//   0  success
//   1  the job failed or was cancelled (submit --wait, watch, get --wait), or the server
//      failed in a way that is none of the below (INTERNAL, UNKNOWN, ...)
//   2  invalid input: bad YAML or flags, or the server answered INVALID_ARGUMENT,
//      FAILED_PRECONDITION, NOT_FOUND, ALREADY_EXISTS or OUT_OF_RANGE
//   3  cannot reach or authenticate to the server: UNAVAILABLE, DEADLINE_EXCEEDED,
//      UNAUTHENTICATED, PERMISSION_DENIED
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "loom/v1/job.pb.h"

namespace loom::client {

enum ExitCode : int {
  kExitOk = 0,
  kExitJobFailed = 1,
  kExitInvalidInput = 2,
  kExitUnreachable = 3,
};

// The exit code for an error of a command (kExitOk for an OK status).
ExitCode ExitCodeForStatus(const absl::Status& status);

// The exit code for a job that reached `state`: 0 for SUCCEEDED, 1 for FAILED and CANCELLED
// (and 0 for non-terminal states, which only `get` without --wait prints).
ExitCode ExitCodeForJobState(loom::v1::JobState state);

// The message to print for an error, on one line, starting with "loomctl: ". Connection and
// authentication errors name `server` and how to point loomctl elsewhere; other errors keep
// the server's message verbatim (it names the field and the fix).
std::string DescribeError(const absl::Status& status, absl::string_view server);

}  // namespace loom::client
