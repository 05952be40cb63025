// Failure handling of the communicators (DESIGN.md, "Reliability contract": a gang lives and
// dies together, a dead peer must not hang it):
//   - a rendezvous that times out names the ranks that never arrived;
//   - a peer that dies (SIGKILL) or hangs mid-collective makes every survivor's Wait() throw
//     CommError within the collective timeout plus a margin, with real processes
//     (comm_test_rank, a test role) and with the real loom-train (exit 1, retryable);
//   - Abort() unblocks every waiter at once.
// Everything here needs Gloo and is skipped without it.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/train/child_process.h"
#include "tests/train/gloo_world.h"
#include "tests/train/test_util.h"
#include "worker/train/comm/bootstrap.h"
#include "worker/train/comm/communicator.h"

namespace loom::train {
namespace {

using testing::Clock;
using testing::Exit;
using testing::ExitedWith;
using testing::ReadText;
using testing::Since;
using testing::Spawn;
using testing::TempDir;
using testing::WaitAll;
using testing::WaitForText;

TEST(RendezvousFailureTest, TimeoutNamesTheRanksThatNeverArrived) {
  if (!HaveMultiProcessComm()) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  // A world of 3 where only ranks 0 and 1 come.
  std::vector<std::string> errors(2);
  std::vector<double> waited(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      RendezvousConfig rc;
      rc.rank = r;
      rc.world_size = 3;
      rc.store_dir = dir.path();
      rc.timeout = std::chrono::milliseconds(700);
      const Clock::time_point start = Clock::now();
      try {
        ConnectWorld(rc);
      } catch (const CommError& e) {
        errors[r] = e.what();
      }
      waited[r] = Since(start);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("rendezvous of 3 ranks timed out after 0.7 s in the file store in " +
                             dir.path()),
              std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find(": rank 2 never arrived"), std::string::npos) << errors[r];
    EXPECT_GE(waited[r], 0.6);
    EXPECT_LT(waited[r], 3.0);
  }
}

TEST(RendezvousFailureTest, TimeoutListsEveryMissingRank) {
  if (!HaveMultiProcessComm()) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  RendezvousConfig rc;
  rc.rank = 1;
  rc.world_size = 4;  // only rank 1 comes
  rc.store_dir = dir.path();
  rc.timeout = std::chrono::milliseconds(300);
  try {
    ConnectWorld(rc);
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1: rendezvous of 4 ranks timed out after 0.3 s"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(": ranks 0, 2, 3 never arrived"), std::string::npos)
        << e.what();
  }
}

constexpr int kTimeoutMs = 3000;
constexpr double kMarginS = 3.0;

std::vector<std::string> RankArgs(const TempDir& dir, int rank, int size,
                                  const std::vector<std::string>& extra) {
  std::vector<std::string> a = {LOOM_COMM_TEST_RANK_BIN,
                                "--store",
                                dir / "store",
                                "--rank",
                                std::to_string(rank),
                                "--size",
                                std::to_string(size),
                                "--iterations",
                                "50",
                                "--timeout-ms",
                                std::to_string(kTimeoutMs)};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(PeerFailureTest, HealthyWorldCompletes) {
  // The control: without a failure the test rank computes every sum right and exits 0.
  if (!HaveMultiProcessComm()) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r) {
    pids.push_back(Spawn(RankArgs(dir, r, 3, {}), dir / ("rank" + std::to_string(r))));
  }
  std::vector<Exit> exits = WaitAll(pids, 60);
  for (int r = 0; r < 3; ++r) {
    const std::string prefix = dir / ("rank" + std::to_string(r));
    EXPECT_TRUE(ExitedWith(exits[r], 0)) << "rank " << r << ": " << ReadText(prefix + ".err");
    EXPECT_NE(ReadText(prefix + ".out").find("iteration 49 ok"), std::string::npos);
  }
}

TEST(PeerFailureTest, KilledPeerFailsEverySurvivorWithinTheTimeout) {
  if (!HaveMultiProcessComm()) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> extra;
    if (r == 1) extra = {"--die-at", "5"};
    pids.push_back(Spawn(RankArgs(dir, r, 3, extra), dir / ("rank" + std::to_string(r))));
  }
  std::vector<Exit> exits = WaitAll(pids, 60);
  ASSERT_TRUE(exits[1].exited);
  ASSERT_TRUE(WIFSIGNALED(exits[1].status) && WTERMSIG(exits[1].status) == SIGKILL);
  for (int r : {0, 2}) {
    const std::string prefix = dir / ("rank" + std::to_string(r));
    const std::string out = ReadText(prefix + ".out"), err = ReadText(prefix + ".err");
    EXPECT_TRUE(ExitedWith(exits[r], 1))
        << "rank " << r << " status " << exits[r].status << ": " << err;
    const double after_death = std::chrono::duration<double>(exits[r].when - exits[1].when).count();
    EXPECT_LT(after_death, kTimeoutMs / 1000.0 + kMarginS) << "rank " << r;
    // The collectives before the death completed; the one the dead rank never joined failed.
    EXPECT_NE(out.find("iteration 4 ok"), std::string::npos) << out;
    EXPECT_EQ(out.find("iteration 5 ok"), std::string::npos) << out;
    EXPECT_NE(err.find("communication: gloo allreduce"), std::string::npos) << err;
    std::printf("rank %d failed %.3f s after rank 1 died: %s", r, after_death, err.c_str());
  }
}

TEST(PeerFailureTest, KilledPeerFailsPointToPointSurvivorsWithinTheTimeout) {
  // The pipeline's path: Send/Recv around a ring, and rank 1 dies. Rank 2 waits to receive
  // from it; rank 0 sends to it (and may finish one more iteration before its send fails).
  if (!HaveMultiProcessComm()) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> extra = {"--mode", "ring"};
    if (r == 1) extra.insert(extra.end(), {"--die-at", "5"});
    pids.push_back(Spawn(RankArgs(dir, r, 3, extra), dir / ("rank" + std::to_string(r))));
  }
  std::vector<Exit> exits = WaitAll(pids, 60);
  ASSERT_TRUE(exits[1].exited);
  ASSERT_TRUE(WIFSIGNALED(exits[1].status) && WTERMSIG(exits[1].status) == SIGKILL)
      << ReadText(dir / "rank1.err");
  for (int r : {0, 2}) {
    const std::string prefix = dir / ("rank" + std::to_string(r));
    const std::string err = ReadText(prefix + ".err");
    EXPECT_TRUE(ExitedWith(exits[r], 1))
        << "rank " << r << " status " << exits[r].status << ": " << err;
    const double after_death = std::chrono::duration<double>(exits[r].when - exits[1].when).count();
    EXPECT_LT(after_death, kTimeoutMs / 1000.0 + kMarginS) << "rank " << r;
    EXPECT_NE(ReadText(prefix + ".out").find("iteration 4 ok"), std::string::npos);
    EXPECT_NE(err.find("communication: gloo "), std::string::npos) << err;
    std::printf("rank %d failed %.3f s after rank 1 died: %s", r, after_death, err.c_str());
  }
}

TEST(PeerFailureTest, HungPeerFailsEverySurvivorAtTheTimeout) {
  if (!HaveMultiProcessComm()) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> extra;
    if (r == 1) extra = {"--hang-at", "5"};
    pids.push_back(Spawn(RankArgs(dir, r, 3, extra), dir / ("rank" + std::to_string(r))));
  }
  // Rank 1 prints its last good iteration, then stops without dying: only the timeout of the
  // others' collective can end their wait.
  ASSERT_TRUE(WaitForText(dir / "rank1.out", "iteration 4 ok", 30));
  const Clock::time_point hung = Clock::now();
  std::vector<Exit> survivors = WaitAll({pids[0], pids[2]}, kTimeoutMs / 1000.0 + 30);
  ::kill(pids[1], SIGKILL);
  ::waitpid(pids[1], nullptr, 0);
  for (int i = 0; i < 2; ++i) {
    const int r = i == 0 ? 0 : 2;
    const std::string err = ReadText(dir / ("rank" + std::to_string(r) + ".err"));
    EXPECT_TRUE(ExitedWith(survivors[i], 1)) << "rank " << r << ": " << err;
    const double waited = std::chrono::duration<double>(survivors[i].when - hung).count();
    // Not before the timeout (a survivor cannot tell a slow peer from a hung one sooner), and
    // not much after it. The skew between ranks' issue times is well under a second here.
    EXPECT_GT(waited, kTimeoutMs / 1000.0 - 1.0) << "rank " << r;
    EXPECT_LT(waited, kTimeoutMs / 1000.0 + kMarginS) << "rank " << r;
    EXPECT_EQ(ReadText(dir / ("rank" + std::to_string(r) + ".out")).find("iteration 5 ok"),
              std::string::npos);
    std::printf("rank %d failed %.3f s after rank 1 hung: %s", r, waited, err.c_str());
  }
}

// Starts rank `rank` of a dp = 2 loom-train world of `tiny` that trains far longer than any
// test waits; stdout (step lines) and stderr in dir/train<rank>.out and .err.
pid_t StartLoomTrain(const TempDir& dir, int rank, int timeout_s) {
  std::map<std::string, std::string> env = {
      {"LOOM_RANK", std::to_string(rank)},
      {"LOOM_WORLD_SIZE", "2"},
      {"LOOM_LAYOUT", "data=2,tensor=1,pipeline=1,micro_batch=2,num_micro_batches=1"},
      {"LOOM_RENDEZVOUS_DIR", dir / "rv"},
      {"LOOM_COMM_TIMEOUT_S", std::to_string(timeout_s)},
      {"OMP_NUM_THREADS", "1"},
      {"OPENBLAS_NUM_THREADS", "1"}};
  return Spawn({LOOM_TRAIN_BIN, "--preset", "tiny", "--data-builtin", "tiny-corpus", "--steps",
                "1000000", "--seq-len", "32", "--global-batch-tokens", "128", "--quiet"},
               dir / ("train" + std::to_string(rank)), env);
}

TEST(PeerFailureTest, LoomTrainSurvivorExitsRetryableWhenItsPeerHangs) {
  // SIGSTOP: the peer is alive but silent, so only LOOM_COMM_TIMEOUT_S can end the wait.
  if (!HaveMultiProcessComm()) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  const int timeout_s = 3;
  std::vector<pid_t> pids = {StartLoomTrain(dir, 0, timeout_s), StartLoomTrain(dir, 1, timeout_s)};
  const bool stepping = WaitForText(dir / "train1.out", "\"event\":\"step\"", 60);
  ::kill(pids[1], SIGSTOP);
  const Clock::time_point stopped = Clock::now();
  std::vector<Exit> exits = WaitAll({pids[0]}, timeout_s + 30);
  ::kill(pids[1], SIGKILL);
  ::waitpid(pids[1], nullptr, 0);
  ASSERT_TRUE(stepping) << ReadText(dir / "train1.err");
  const std::string err = ReadText(dir / "train0.err");
  EXPECT_TRUE(ExitedWith(exits[0], 1)) << "status " << exits[0].status << ": " << err;
  const double after = std::chrono::duration<double>(exits[0].when - stopped).count();
  // At most one collective's timeout after the stop (plus a margin); at least most of one,
  // since rank 0 cannot have issued its waiting collective long before rank 1 stopped.
  EXPECT_GT(after, timeout_s - 1.0) << err;
  EXPECT_LT(after, timeout_s + kMarginS) << err;
  EXPECT_NE(err.find("communication"), std::string::npos) << err;
  EXPECT_NE(err.find("Timed out"), std::string::npos) << err;
  std::printf("loom-train rank 0 exited %.3f s after rank 1 stopped: %s", after, err.c_str());
}

TEST(PeerFailureTest, LoomTrainSurvivorExitsRetryableWhenItsPeerIsKilled) {
  if (!HaveMultiProcessComm()) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  const int timeout_s = 5;
  std::vector<pid_t> pids = {StartLoomTrain(dir, 0, timeout_s), StartLoomTrain(dir, 1, timeout_s)};
  // Kill rank 1 once it is stepping (its step lines are on stdout), i.e. mid-training.
  const bool stepping = WaitForText(dir / "train1.out", "\"event\":\"step\"", 60);
  ::kill(pids[1], SIGKILL);
  const Clock::time_point killed = Clock::now();
  ASSERT_TRUE(stepping) << ReadText(dir / "train1.err");
  std::vector<Exit> exits = WaitAll(pids, timeout_s + 30);
  const std::string err = ReadText(dir / "train0.err");
  EXPECT_TRUE(ExitedWith(exits[0], 1)) << "status " << exits[0].status << ": " << err;
  const double after = std::chrono::duration<double>(exits[0].when - killed).count();
  EXPECT_LT(after, timeout_s + kMarginS) << err;
  EXPECT_NE(err.find("communication"), std::string::npos) << err;
  EXPECT_NE(ReadText(dir / "train0.out").find("\"event\":\"step\""), std::string::npos);
  std::printf("loom-train rank 0 exited %.3f s after rank 1 was killed: %s", after, err.c_str());
}

TEST(AbortTest, AbortUnblocksEveryWaiterAtOnce) {
  if (!HaveMultiProcessComm()) GTEST_SKIP() << "built without Gloo";
  std::mutex mu;
  std::condition_variable cv;
  bool rank0_done = false;
  // Outside the ranks' bodies: the aborted collective may still touch its buffer until the
  // communicator is destroyed (the Abort contract).
  std::vector<float> a(64, 1.0f);
  float x = 0.0f;
  testing::RunGlooWorld(2, std::chrono::seconds(3), [&](int r, Communicator& c) {
    if (r == 1) {
      // Joins nothing, but stays connected until rank 0 is done: its death would otherwise
      // fail rank 0's collective before the Abort could.
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return rank0_done; });
      return;
    }
    // A running collective that can never finish, one queued behind it, and a receive.
    std::vector<WorkHandle> works = {c.AllReduceSum(a.data(), a.size()), c.Barrier(),
                                     c.Recv(&x, 1, 1, 3)};
    works.push_back(works[0]);  // two threads wait on the same Work
    std::vector<std::thread> waiters;
    std::vector<std::string> messages(works.size());
    std::vector<Clock::time_point> woke(works.size());
    std::atomic<int> waiting{0};
    for (size_t i = 0; i < works.size(); ++i) {
      waiters.emplace_back([&, i] {
        ++waiting;
        try {
          works[i]->Wait();
          messages[i] = "completed";
        } catch (const CommError& e) {
          messages[i] = e.what();
        }
        woke[i] = Clock::now();
      });
    }
    while (waiting.load() < static_cast<int>(works.size())) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    for (const WorkHandle& w : works) EXPECT_FALSE(w->Done());  // really blocked
    const Clock::time_point aborted = Clock::now();
    c.Abort("test abort");
    for (auto& t : waiters) t.join();
    for (size_t i = 0; i < works.size(); ++i) {
      EXPECT_NE(messages[i].find("aborted: test abort"), std::string::npos) << messages[i];
      EXPECT_LT(std::chrono::duration<double>(woke[i] - aborted).count(), 1.0) << i;
    }
    // Everything after an Abort fails at once, without touching the network.
    const Clock::time_point after = Clock::now();
    EXPECT_THROW(c.AllReduceSum(a.data(), a.size())->Wait(), CommError);
    EXPECT_THROW(c.Send(&x, 1, 1, 4)->Wait(), CommError);
    EXPECT_LT(Since(after), 0.5);
    {
      std::lock_guard<std::mutex> lock(mu);
      rank0_done = true;
    }
    cv.notify_all();
  });
}

TEST(AbortTest, AFailedCollectiveFailsEveryLaterOneAtOnce) {
  // Collectives match by order across ranks: after one failed, none later can match, so they
  // must fail at once with the first failure's message rather than each wait for its timeout.
  if (!HaveMultiProcessComm()) GTEST_SKIP() << "built without Gloo";
  testing::RunGlooWorld(2, std::chrono::seconds(20), [&](int r, Communicator& c) {
    if (r == 1) return;  // destroys its communicator: its connections close
    // RunGlooWorld's rank 1 returns at once; give its destructor a moment to close the sockets.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::vector<float> a(64, 1.0f);
    const Clock::time_point start = Clock::now();
    EXPECT_THROW(c.AllReduceSum(a.data(), a.size())->Wait(), CommError);
    try {
      c.Barrier()->Wait();
      ADD_FAILURE() << "expected CommError";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("gloo barrier: aborted: gloo allreduce"),
                std::string::npos)
          << e.what();
    }
    EXPECT_LT(Since(start), 5.0);  // far below the 20 s timeout
  });
}

}  // namespace
}  // namespace loom::train
