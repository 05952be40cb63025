// LaunchPool: a gang's launches run on several threads, and each result comes back at its
// request's index, with the started process really running its own request.
#include "worker/agent/launch_pool.h"

#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace loom::worker {
namespace {

// A rank that exits with the code its environment names.
LaunchRequest ExitWith(int code) {
  LaunchRequest r;
  r.program = "/bin/sh";
  r.args = {"-c", "exit $CODE"};
  r.env = {{"CODE", absl::StrCat(code)}};
  return r;
}

int Reap(const LaunchedProcess& p) {
  for (int fd : {p.stdout_fd, p.stderr_fd, p.progress_fd, p.fence_fd}) ::close(fd);
  int status = 0;
  if (::waitpid(p.pid, &status, 0) != p.pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(LaunchPoolTest, ResultsComeBackInRequestOrder) {
  for (int helpers : {0, 1, 3}) {
    LaunchPool pool(helpers);
    std::vector<LaunchRequest> requests;
    for (int i = 0; i < 8; ++i) requests.push_back(ExitWith(10 + i));
    requests[5].program = "/nonexistent/rank";  // one failure, at its own index only
    std::vector<absl::StatusOr<LaunchedProcess>> results = pool.LaunchAll(requests);
    ASSERT_EQ(results.size(), 8u);
    for (int i = 0; i < 8; ++i) {
      if (i == 5) {
        EXPECT_TRUE(absl::IsFailedPrecondition(results[i].status())) << results[i].status();
        continue;
      }
      ASSERT_TRUE(results[i].ok())
          << "helpers " << helpers << " rank " << i << ": " << results[i].status();
      EXPECT_EQ(Reap(*results[i]), 10 + i) << "helpers " << helpers << " rank " << i;
    }
  }
}

TEST(LaunchPoolTest, ServesOneGangAfterAnother) {
  LaunchPool pool(2);
  for (int gang = 0; gang < 20; ++gang) {
    std::vector<LaunchRequest> requests = {ExitWith(gang), ExitWith(gang + 1)};
    std::vector<absl::StatusOr<LaunchedProcess>> results = pool.LaunchAll(requests);
    ASSERT_EQ(results.size(), 2u);
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(results[i].ok()) << results[i].status();
      EXPECT_EQ(Reap(*results[i]), gang + i);
    }
  }
  EXPECT_TRUE(pool.LaunchAll({}).empty());
}

}  // namespace
}  // namespace loom::worker
