#include "client/exit_codes.h"

#include "absl/strings/str_cat.h"

namespace loom::client {

ExitCode ExitCodeForStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kOutOfRange:
      return kExitInvalidInput;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return kExitUnreachable;
    default:
      return kExitJobFailed;
  }
}

ExitCode ExitCodeForJobState(loom::v1::JobState state) {
  switch (state) {
    case loom::v1::FAILED:
    case loom::v1::CANCELLED:
      return kExitJobFailed;
    default:
      return kExitOk;
  }
}

std::string DescribeError(const absl::Status& status, absl::string_view server) {
  const absl::string_view msg = status.message();
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
      return absl::StrCat("loomctl: cannot reach loomd at ", server, ": ", msg,
                          " (is loomd running there? set --server or LOOM_SERVER)");
    case absl::StatusCode::kDeadlineExceeded:
      return absl::StrCat("loomctl: loomd at ", server, " did not answer in time: ", msg,
                          " (check the address, or raise --timeout)");
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return absl::StrCat("loomctl: loomd at ", server, " refused the request (",
                          absl::StatusCodeToString(status.code()), "): ", msg,
                          " (check your credentials for this server)");
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kOutOfRange:
      return absl::StrCat("loomctl: ", msg);
    default:
      return absl::StrCat("loomctl: ", absl::StatusCodeToString(status.code()), ": ", msg);
  }
}

}  // namespace loom::client
