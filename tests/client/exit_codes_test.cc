// loomctl exit codes from status codes and job states (client/exit_codes.h).
#include "client/exit_codes.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace loom::client {
namespace {

using ::testing::HasSubstr;

TEST(ExitCodesTest, StatusCodesMapToTheDocumentedExitCodes) {
  EXPECT_EQ(ExitCodeForStatus(absl::OkStatus()), 0);
  for (auto code : {absl::StatusCode::kInvalidArgument, absl::StatusCode::kFailedPrecondition,
                    absl::StatusCode::kNotFound, absl::StatusCode::kAlreadyExists,
                    absl::StatusCode::kOutOfRange}) {
    EXPECT_EQ(ExitCodeForStatus(absl::Status(code, "x")), 2) << absl::StatusCodeToString(code);
  }
  for (auto code : {absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded,
                    absl::StatusCode::kUnauthenticated, absl::StatusCode::kPermissionDenied}) {
    EXPECT_EQ(ExitCodeForStatus(absl::Status(code, "x")), 3) << absl::StatusCodeToString(code);
  }
  EXPECT_EQ(ExitCodeForStatus(absl::InternalError("boom")), 1);
}

TEST(ExitCodesTest, JobStates) {
  EXPECT_EQ(ExitCodeForJobState(loom::v1::SUCCEEDED), 0);
  EXPECT_EQ(ExitCodeForJobState(loom::v1::FAILED), 1);
  EXPECT_EQ(ExitCodeForJobState(loom::v1::CANCELLED), 1);
  EXPECT_EQ(ExitCodeForJobState(loom::v1::RUNNING), 0);
}

TEST(ExitCodesTest, MessagesNameTheServerOrKeepTheServersText) {
  EXPECT_THAT(DescribeError(absl::UnavailableError("connection refused"), "10.0.0.1:7070"),
              HasSubstr("cannot reach loomd at 10.0.0.1:7070: connection refused"));
  EXPECT_THAT(DescribeError(absl::UnauthenticatedError("no token"), "h:1"),
              HasSubstr("loomd at h:1 refused the request (UNAUTHENTICATED): no token"));
  EXPECT_EQ(DescribeError(absl::InvalidArgumentError("resources.gpus: must be > 0"), "h:1"),
            "loomctl: resources.gpus: must be > 0");
}

}  // namespace
}  // namespace loom::client
