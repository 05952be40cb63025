// The invariance test of data parallelism (DESIGN.md, "The invariance principle"): 10 steps of
// `tiny` with one global batch give the same per-step losses as one process and as dp = 2 and
// dp = 4 separate loom-train processes (LOOM_RANK / LOOM_WORLD_SIZE / LOOM_LAYOUT, a temp
// rendezvous directory), within relative 1e-5, with gradients travelling in several buckets.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/child_signals.h"
#include "tests/train/test_util.h"
#include "worker/train/comm/bootstrap.h"
#include "worker/train/config/json.h"

namespace loom::train {
namespace {

using testing::ReadText;
using testing::TempDir;

constexpr int kSteps = 10;
constexpr int kMicroBatch = 2;
constexpr int kSequencesPerStep = 8;  // global batch: 8 sequences of 32 tokens

struct RankRun {
  std::vector<double> losses;      // per step
  std::vector<double> grad_norms;  // per step
  double comm_exposed = 0.0;       // seconds, summed over the steps
  double step_seconds = 0.0;       // seconds, summed over the steps
  uint64_t allreduce_bytes = 0;    // per step
  std::string err;
};

double Number(const Value& v, const char* key) {
  const Value* f = v.Find(key);
  return f ? std::strtod(f->text.c_str(), nullptr) : NAN;
}

// Starts rank `rank` of a world of `dp` ranks as a child process; returns its pid.
pid_t StartRank(const TempDir& dir, int dp, int rank) {
  const std::string out = dir / ("out-" + std::to_string(dp) + "-" + std::to_string(rank));
  const std::string layout = "data=" + std::to_string(dp) +
                             ",tensor=1,pipeline=1,micro_batch=" + std::to_string(kMicroBatch) +
                             ",num_micro_batches=" +
                             std::to_string(kSequencesPerStep / kMicroBatch / dp);
  const std::string rendezvous = dir / ("rv-" + std::to_string(dp));
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::loom::testing::ResetSignalsForExec();  // as the worker's launcher gives a rank
  // The child: environment, output files, exec.
  ::setenv("LOOM_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOOM_WORLD_SIZE", std::to_string(dp).c_str(), 1);
  ::setenv("LOOM_LAYOUT", layout.c_str(), 1);
  ::setenv("LOOM_RENDEZVOUS_DIR", rendezvous.c_str(), 1);
  ::setenv("LOOM_COMM_TIMEOUT_S", "60", 1);
  ::setenv("OMP_NUM_THREADS", "1", 1);
  ::setenv("OPENBLAS_NUM_THREADS", "1", 1);
  ::unsetenv("LOOM_PROGRESS_FD");
  ::unsetenv("LOOM_SPEC_FILE");
  int fd_out = ::open((out + ".json").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int fd_err = ::open((out + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd_out < 0 || fd_err < 0) ::_exit(127);
  ::dup2(fd_out, 1);
  ::dup2(fd_err, 2);
  const char* argv[] = {LOOM_TRAIN_BIN,  "--preset",      "tiny",     "--data-builtin",
                        "tiny-corpus",   "--steps",       "10",       "--seq-len",
                        "32",            "--global-batch-tokens", "256", "--dp-bucket-mb",
                        "0.05",          "--quiet",       nullptr};
  ::execv(LOOM_TRAIN_BIN, const_cast<char* const*>(argv));
  ::_exit(127);
}

// Runs a world of `dp` ranks to the end; returns each rank's results.
std::vector<RankRun> RunWorld(const TempDir& dir, int dp) {
  std::vector<pid_t> pids;
  for (int r = 0; r < dp; ++r) pids.push_back(StartRank(dir, dp, r));
  std::vector<RankRun> runs(dp);
  for (int r = 0; r < dp; ++r) {
    int status = 0;
    ::waitpid(pids[r], &status, 0);
    const std::string out = dir / ("out-" + std::to_string(dp) + "-" + std::to_string(r));
    RankRun& run = runs[r];
    run.err = ReadText(out + ".err");
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "dp=" << dp << " rank " << r << " failed:\n" << run.err;
    std::istringstream lines(ReadText(out + ".json"));
    std::string line;
    while (std::getline(lines, line)) {
      if (line.empty()) continue;
      Value v = ParseJson(line, "step line");
      if (!v.Find("event") || v.Find("event")->text != "step") continue;
      run.losses.push_back(Number(v, "loss"));
      run.grad_norms.push_back(Number(v, "grad_norm"));
      run.step_seconds += Number(v, "step_seconds");
      if (const Value* p = v.Find("phases")) run.comm_exposed += Number(*p, "comm_exposed");
      if (const Value* b = v.Find("comm_bytes")) {
        run.allreduce_bytes = static_cast<uint64_t>(Number(*b, "all_reduce"));
      }
    }
  }
  return runs;
}

double RelDiff(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-30); }

TEST(DataParallelInvarianceTest, SameLossesUnderDp1Dp2Dp4) {
  if (!HaveMultiProcessComm()) GTEST_SKIP() << "built without Gloo: dp > 1 needs it";
  TempDir dir;
  std::vector<RankRun> one = RunWorld(dir, 1);
  ASSERT_EQ(one[0].losses.size(), static_cast<size_t>(kSteps)) << one[0].err;
  EXPECT_EQ(one[0].allreduce_bytes, 0u);  // alone: nothing to reduce
  for (int dp : {2, 4}) {
    std::vector<RankRun> runs = RunWorld(dir, dp);
    double max_rel = 0.0;
    for (int r = 0; r < dp; ++r) {
      const RankRun& run = runs[r];
      ASSERT_EQ(run.losses.size(), static_cast<size_t>(kSteps)) << run.err;
      // Several buckets, announced on stderr: "... N gradient buckets".
      size_t at = run.err.find(" gradient buckets");
      ASSERT_NE(at, std::string::npos) << run.err;
      size_t start = run.err.rfind(' ', at - 1) + 1;
      EXPECT_GT(std::stoi(run.err.substr(start, at - start)), 1) << run.err;
      EXPECT_GT(run.allreduce_bytes, 0u);
      for (int s = 0; s < kSteps; ++s) {
        const double rel = RelDiff(run.losses[s], one[0].losses[s]);
        max_rel = std::max(max_rel, rel);
        EXPECT_LE(rel, 1e-5) << "dp=" << dp << " rank " << r << " step " << s + 1 << ": "
                             << run.losses[s] << " vs " << one[0].losses[s];
        // Every rank sees the same averaged gradient, so the same norm.
        EXPECT_EQ(run.grad_norms[s], runs[0].grad_norms[s]) << "step " << s + 1;
      }
      std::printf("dp=%d rank %d: comm_exposed %.4f s of %.4f s over %d steps, %llu bytes "
                  "all-reduced per step\n",
                  dp, r, run.comm_exposed, run.step_seconds, kSteps,
                  static_cast<unsigned long long>(run.allreduce_bytes));
    }
    std::printf("dp=%d: max relative loss difference to dp=1 over %d steps: %.3g\n", dp, kSteps,
                max_rel);
  }
  for (int s = 0; s < kSteps; ++s) std::printf("step %d loss %.7f\n", s + 1, one[0].losses[s]);
}

}  // namespace
}  // namespace loom::train
