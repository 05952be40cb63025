// The children tests start get the signal state of an ordinary shell, whatever the test process
// inherited (tests/support/child_signals.h): a harness that ignores SIGPIPE, SIGINT or SIGTERM
// or blocks signals must not change what the ranks and daemons under test do.
#include "tests/train/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/support/child_signals.h"
#include "tests/train/test_util.h"

extern char** environ;

namespace loom::train {
namespace {

using testing::ReadText;
using testing::TempDir;

// The hexadecimal mask on the line `field` (e.g. "SigIgn:") of a /proc/<pid>/status text.
uint64_t StatusMask(const std::string& status, const std::string& field) {
  std::istringstream in(status);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(field.size()), nullptr, 16);
  }
  ADD_FAILURE() << "no " << field << " in " << status;
  return ~uint64_t{0};
}

uint64_t Bit(int sig) { return uint64_t{1} << (sig - 1); }

// The standard signals 1..31. (32 and 33 belong to glibc's threads; posix_spawn's child may
// show them ignored while it runs glibc code before exec, and no program uses them.)
constexpr uint64_t kStandard = (uint64_t{1} << 31) - 1;

// Sets up what a hostile harness passes down (SIGPIPE, SIGINT and SIGTERM ignored; SIGTERM and
// SIGUSR1 blocked in this thread, the one that forks) and restores it on destruction.
class HostileSignals {
 public:
  HostileSignals() {
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    for (int i = 0; i < 3; ++i) sigaction(kIgnored[i], &ign, &saved_[i]);
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &block, &saved_mask_);
  }
  ~HostileSignals() {
    pthread_sigmask(SIG_SETMASK, &saved_mask_, nullptr);
    for (int i = 0; i < 3; ++i) sigaction(kIgnored[i], &saved_[i], nullptr);
  }

 private:
  static constexpr int kIgnored[3] = {SIGPIPE, SIGINT, SIGTERM};
  struct sigaction saved_[3];
  sigset_t saved_mask_;
};

TEST(ChildProcessTest, SpawnedChildHasDefaultSignalsWhateverTheTestInherited) {
  TempDir dir;
  pid_t pid;
  {
    HostileSignals hostile;
    // The control: this process really has them ignored and blocked, so a plain fork+exec
    // would pass them on.
    const std::string self = ReadText("/proc/self/status");
    ASSERT_EQ(StatusMask(self, "SigIgn:") & Bit(SIGPIPE), Bit(SIGPIPE));
    pid = testing::Spawn({"/bin/cat", "/proc/self/status"}, dir / "cat");
  }
  ASSERT_TRUE(testing::ExitedWith(testing::WaitAll({pid}, 30)[0], 0)) << ReadText(dir / "cat.err");
  const std::string status = ReadText(dir / "cat.out");
  EXPECT_EQ(StatusMask(status, "SigIgn:") & kStandard, 0u) << status;
  EXPECT_EQ(StatusMask(status, "SigBlk:") & kStandard, 0u) << status;
}

TEST(ChildProcessTest, PosixSpawnWithDefaultSignalsResetsThemToo) {
  TempDir dir;
  const std::string out = dir / "status";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  ASSERT_EQ(::loom::testing::SetDefaultSignals(&attr), 0);
  char* argv[] = {const_cast<char*>("/bin/cat"), const_cast<char*>("/proc/self/status"), nullptr};
  pid_t pid = -1;
  {
    HostileSignals hostile;
    ASSERT_EQ(posix_spawn(&pid, argv[0], &actions, &attr, argv, environ), 0);
  }
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  const std::string status = ReadText(out);
  EXPECT_EQ(StatusMask(status, "SigIgn:") & kStandard, 0u) << status;
  EXPECT_EQ(StatusMask(status, "SigBlk:") & kStandard, 0u) << status;
}

}  // namespace
}  // namespace loom::train
