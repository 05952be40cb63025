// Stop requests (worker/train/diag/stop_request.h) with real loom-train processes: SIGUSR2 to
// ONE rank of a two-rank data-parallel gang makes both ranks agree on a step, save a checkpoint
// there and exit 75; the next run resumes from that step. One rank alone does the same without a
// peer. This is what a draining node's worker relies on to keep the gang's work.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/train/child_process.h"
#include "tests/train/test_util.h"
#include "worker/train/comm/bootstrap.h"
#include "worker/train/error.h"

namespace loom::train {
namespace {

using ::testing::HasSubstr;
using testing::ReadText;
using testing::TempDir;

const std::vector<std::string> kFlags = {"--data-builtin",
                                         "tiny-corpus",
                                         "--preset",
                                         "tiny",
                                         "--batch",
                                         "1",
                                         "--seq-len",
                                         "16",
                                         "--global-batch-tokens",
                                         "32",
                                         "--quiet",
                                         "--checkpoint-every",
                                         "5"};

std::vector<std::string> Argv(const std::string& ck, int steps) {
  std::vector<std::string> argv = {LOOM_TRAIN_BIN};
  argv.insert(argv.end(), kFlags.begin(), kFlags.end());
  for (const std::string& a :
       {std::string("--steps"), std::to_string(steps), std::string("--checkpoint-dir"), ck}) {
    argv.push_back(a);
  }
  return argv;
}

// Waits (up to 60 s) until `path` exists.
bool WaitFor(const std::filesystem::path& path) {
  for (int i = 0; i < 6000; ++i) {
    if (std::filesystem::exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The step N of the line "stopped on request after step N", or -1.
long long StoppedAt(const std::string& err) {
  std::smatch m;
  static const std::regex re("stopped on request after step ([0-9]+) \\(checkpoint saved\\)");
  return std::regex_search(err, m, re) ? std::stoll(m[1]) : -1;
}

std::string StepDir(long long step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%06lld", step);
  return buf;
}

std::map<std::string, std::string> RankEnv(int rank) {
  return {{"LOOM_WORLD_SIZE", "2"},
          {"LOOM_RANK", std::to_string(rank)},
          {"LOOM_COMM_TIMEOUT_S", "60"},
          {"LOOM_LAYOUT", "data=2,tensor=1,pipeline=1,micro_batch=1,num_micro_batches=1"},
          {"LOOM_RENDEZVOUS_DIR", "rv"}};
}

TEST(StopRequestTest, OneRankAskedTheGangAgreesSavesAndResumesThere) {
  if (!HaveMultiProcessComm()) GTEST_SKIP() << "built without Gloo: two ranks need it";
  TempDir dir;
  const std::string ck = (dir / "ck");
  const std::string rv = (dir / "rv");
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    auto env = RankEnv(r);
    env["LOOM_RENDEZVOUS_DIR"] = rv;
    pids.push_back(testing::Spawn(Argv(ck, 100000), (dir / ("rank" + std::to_string(r))), env));
  }
  // Training is under way once the first periodic checkpoint exists; then only rank 1 is asked.
  ASSERT_TRUE(WaitFor(std::filesystem::path(ck) / "step-000005" / "manifest.json"));
  ASSERT_EQ(::kill(pids[1], SIGUSR2), 0);
  const std::vector<testing::Exit> exits = testing::WaitAll(pids, 60);
  long long stopped[2];
  for (int r = 0; r < 2; ++r) {
    const std::string err = ReadText(dir / ("rank" + std::to_string(r) + ".err"));
    ASSERT_TRUE(exits[r].exited) << "rank " << r << " did not stop:\n" << err;
    ASSERT_TRUE(WIFEXITED(exits[r].status)) << "rank " << r << ":\n" << err;
    EXPECT_EQ(WEXITSTATUS(exits[r].status), kExitStopped) << "rank " << r << ":\n" << err;
    stopped[r] = StoppedAt(err);
    EXPECT_GE(stopped[r], 5) << "rank " << r << ":\n" << err;
  }
  // The same step on both ranks (rank 0 was never signalled), and its checkpoint is complete.
  EXPECT_EQ(stopped[0], stopped[1]);
  EXPECT_TRUE(
      std::filesystem::exists(std::filesystem::path(ck) / StepDir(stopped[0]) / "manifest.json"))
      << StepDir(stopped[0]);

  // The next run of the gang resumes from the saved step and finishes two steps later.
  pids.clear();
  for (int r = 0; r < 2; ++r) {
    auto env = RankEnv(r);
    env["LOOM_RENDEZVOUS_DIR"] = (dir / "rv2");
    pids.push_back(testing::Spawn(Argv(ck, static_cast<int>(stopped[0]) + 2),
                                  (dir / ("again" + std::to_string(r))), env));
  }
  const std::vector<testing::Exit> again = testing::WaitAll(pids, 60);
  for (int r = 0; r < 2; ++r) {
    const std::string err = ReadText(dir / ("again" + std::to_string(r) + ".err"));
    ASSERT_TRUE(again[r].exited && WIFEXITED(again[r].status)) << err;
    EXPECT_EQ(WEXITSTATUS(again[r].status), kExitOk) << err;
    EXPECT_THAT(err, HasSubstr("(step " + std::to_string(stopped[0]) + ")")) << err;
  }
}

TEST(StopRequestTest, ARankAloneSavesAndExits75) {
  TempDir dir;
  const std::string ck = (dir / "ck");
  pid_t pid = testing::Spawn(Argv(ck, 100000), (dir / "rank"));
  ASSERT_TRUE(WaitFor(std::filesystem::path(ck) / "step-000005" / "manifest.json"));
  ASSERT_EQ(::kill(pid, SIGUSR2), 0);
  const std::vector<testing::Exit> exits = testing::WaitAll({pid}, 60);
  const std::string err = ReadText(dir / "rank.err");
  ASSERT_TRUE(exits[0].exited && WIFEXITED(exits[0].status)) << err;
  EXPECT_EQ(WEXITSTATUS(exits[0].status), kExitStopped) << err;
  const long long step = StoppedAt(err);
  ASSERT_GE(step, 5) << err;
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(ck) / StepDir(step) / "manifest.json"));
}

}  // namespace
}  // namespace loom::train
