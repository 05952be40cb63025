// A rank's environment (its job's rendezvous secret and spec.env values) is not readable by
// another process of the same user: the ranks of every job on a node share one user (the
// worker's --rank-user), so without this one job's rank could read another's secret from
// /proc/PID/environ. loom-train makes itself non-dumpable (worker/train/main.cc).
//
// Both processes run as "nobody" when the test runs as root (root reads any environ), else as
// the test's own user.
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "tests/support/child_signals.h"
#include "tests/train/test_util.h"

namespace loom::train {
namespace {

// The uid both processes take: nobody's when root, else ours (-1: no such user).
uid_t TargetUid() {
  if (::geteuid() != 0) return ::geteuid();
  const passwd* nobody = ::getpwnam("nobody");
  return nobody == nullptr ? static_cast<uid_t>(-1) : nobody->pw_uid;
}

// In a child: becomes `uid` (when root), with that user's group.
void BecomeTarget(uid_t uid) {
  if (::geteuid() != 0) return;
  const passwd* user = ::getpwuid(uid);
  if (user == nullptr || ::setgroups(0, nullptr) != 0 || ::setgid(user->pw_gid) != 0 ||
      ::setuid(uid) != 0) {
    ::_exit(120);
  }
}

TEST(RankPrivacyTest, AnotherProcessOfTheRankUserCannotReadItsEnvironment) {
  const uid_t uid = TargetUid();
  if (uid == static_cast<uid_t>(-1)) GTEST_SKIP() << "no user nobody to run the ranks as";
  testing::TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0777), 0);  // nobody's rank runs in it
  const pid_t rank = ::fork();
  ASSERT_GE(rank, 0);
  if (rank == 0) {
    ::loom::testing::ResetSignalsForExec();
    BecomeTarget(uid);
    if (::chdir(dir.path().c_str()) != 0) ::_exit(121);
    ::setenv("LOOM_RENDEZVOUS_SECRET", "secret-of-job-a", 1);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execl(LOOM_TRAIN_BIN, LOOM_TRAIN_BIN, "--data-builtin", "tiny-corpus", "--preset", "tiny",
            "--steps", "1000000", "--quiet", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Until loom-train runs its main (after exec and the dynamic loader).
  const std::string comm_path = "/proc/" + std::to_string(rank) + "/comm";
  for (int i = 0; i < 500 && testing::ReadText(comm_path) != "loom-train\n"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(testing::ReadText(comm_path), "loom-train\n");

  // A second process of the same user tries to read the rank's environment.
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t reader = ::fork();
  ASSERT_GE(reader, 0);
  if (reader == 0) {
    BecomeTarget(uid);
    const std::string path = "/proc/" + std::to_string(rank) + "/environ";
    const int fd = ::open(path.c_str(), O_RDONLY);
    std::string seen = fd < 0 ? "open: " + std::string(std::strerror(errno)) : "";
    char buf[65536];
    const ssize_t n = fd < 0 ? 0 : ::read(fd, buf, sizeof(buf));
    if (fd >= 0 && n < 0) seen = "read: " + std::string(std::strerror(errno));
    if (n > 0) seen.assign(buf, static_cast<size_t>(n));
    (void)!::write(pipe_fds[1], seen.data(), seen.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string seen;
  char buf[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0;) seen.append(buf, n);
  ::close(pipe_fds[0]);
  ::waitpid(reader, nullptr, 0);
  ::kill(rank, SIGKILL);
  ::waitpid(rank, nullptr, 0);

  EXPECT_EQ(seen.find("secret-of-job-a"), std::string::npos)
      << "another process of the rank's user read its environment";
  EXPECT_NE(seen.find("Permission denied"), std::string::npos) << seen;
}

}  // namespace
}  // namespace loom::train
