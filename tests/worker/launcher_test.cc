// Launcher: what a rank starts with (dispositions, mask, descriptors) and how a failure before
// the exec is reported.
#include "worker/agent/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "worker/agent/launch_pool.h"

namespace loom::worker {
namespace {

void Ignore(int) {}

// Sets dispositions for the test's duration and restores them.
class Dispositions {
 public:
  Dispositions() {
    ::sigaction(SIGPIPE, nullptr, &old_pipe_);
    ::sigaction(SIGUSR1, nullptr, &old_usr1_);
    ::signal(SIGPIPE, SIG_IGN);
    struct sigaction handled {};
    handled.sa_handler = Ignore;
    ::sigaction(SIGUSR1, &handled, nullptr);
  }
  ~Dispositions() {
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    ::sigaction(SIGUSR1, &old_usr1_, nullptr);
  }

 private:
  struct sigaction old_pipe_ {};
  struct sigaction old_usr1_ {};
};

// Everything the rank writes to stdout, and its exit code (-1 if it did not exit normally).
std::pair<std::string, int> Collect(const LaunchedProcess& p) {
  std::string out;
  for (;;) {
    pollfd pfd{p.stdout_fd, POLLIN, 0};
    if (::poll(&pfd, 1, 10000) <= 0) break;
    char buf[4096];
    const ssize_t n = ::read(p.stdout_fd, buf, sizeof(buf));
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  for (int fd : {p.stdout_fd, p.stderr_fd, p.progress_fd, p.fence_fd}) ::close(fd);
  int status = 0;
  if (::waitpid(p.pid, &status, 0) != p.pid || !WIFEXITED(status)) return {out, -1};
  return {out, WEXITSTATUS(status)};
}

TEST(NonDefaultSignalsTest, NamesTheIgnoredAndTheHandledSignalsOnly) {
  Dispositions set;
  const SignalSnapshot snapshot = NonDefaultSignals();
  bool pipe = false, usr1 = false, term = false;
  for (int i = 0; i < snapshot.count; ++i) {
    pipe |= snapshot.signals[i] == SIGPIPE;
    usr1 |= snapshot.signals[i] == SIGUSR1;
    term |= snapshot.signals[i] == SIGTERM;
  }
  EXPECT_TRUE(pipe);
  EXPECT_TRUE(usr1);
  EXPECT_FALSE(term);
  EXPECT_LT(snapshot.count, 8);  // a test process changes few; a worker only SIGPIPE
}

// The lines of /proc/PID/status that show a process's signal mask and dispositions.
std::string SignalLines(const std::string& status) {
  std::string lines;
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (absl::StartsWith(line, "SigBlk:") || absl::StartsWith(line, "SigIgn:") ||
        absl::StartsWith(line, "SigCgt:")) {
      absl::StrAppend(&lines, line, "\n");
    }
  }
  return lines;
}

// Through the pool (which resets only the snapshot's signals) and through Launch() alone (which
// resets all), a rank starts with no ignored or caught signal and an empty mask (cat prints its
// own status, and changes none of them), and with descriptors 0-3 and 5 only (sh's tests are
// built-ins: they open nothing), although the launching process ignores SIGPIPE and handles
// SIGUSR1.
TEST(LauncherTest, RankStartsWithDefaultDispositionsAndTheContractsDescriptors) {
  Dispositions set;
  LaunchRequest status;
  status.program = "/bin/cat";
  status.args = {"/proc/self/status"};
  LaunchRequest fds;
  fds.program = "/bin/sh";
  fds.args = {"-c",
              "for f in 0 1 2 3 4 5 6 7 8 9 10 11 12; do [ -e /proc/$$/fd/$f ] && echo $f; done"};
  const std::string defaults =
      "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\nSigCgt:\t0000000000000000\n";
  LaunchPool pool(1);
  std::vector<absl::StatusOr<LaunchedProcess>> pooled = pool.LaunchAll({status, fds, status});
  ASSERT_EQ(pooled.size(), 3u);
  for (absl::StatusOr<LaunchedProcess>& launched : pooled) ASSERT_TRUE(launched.ok());
  EXPECT_EQ(SignalLines(Collect(*pooled[0]).first), defaults);
  EXPECT_EQ(Collect(*pooled[1]).first, "0\n1\n2\n3\n5\n");
  EXPECT_EQ(SignalLines(Collect(*pooled[2]).first), defaults);
  absl::StatusOr<LaunchedProcess> alone = Launch(status);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(SignalLines(Collect(*alone).first), defaults);
}

TEST(LauncherTest, FailuresBeforeTheExecNameTheStepAndTheError) {
  LaunchRequest r;
  r.program = "/nonexistent/loom-train";
  absl::StatusOr<LaunchedProcess> missing = Launch(r);
  EXPECT_TRUE(absl::IsFailedPrecondition(missing.status())) << missing.status();
  EXPECT_EQ(missing.status().message(), "exec /nonexistent/loom-train: No such file or directory");

  r.program = "/bin/true";
  r.cwd = "/nonexistent/work";
  absl::StatusOr<LaunchedProcess> no_dir = Launch(r);
  EXPECT_TRUE(absl::IsFailedPrecondition(no_dir.status())) << no_dir.status();
  EXPECT_EQ(no_dir.status().message(), "chdir /nonexistent/work: No such file or directory");

  // A failure leaves no descriptor behind: the next launch gets the same numbers.
  const int probe = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(probe, 0);
  ::close(probe);
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(Launch(r).ok());
  const int again = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  EXPECT_EQ(again, probe);
  ::close(again);
}

}  // namespace
}  // namespace loom::worker
