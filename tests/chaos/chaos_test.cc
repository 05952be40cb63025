// The seeded fault run: many short checkpointing jobs on a real local cluster (loomd, two
// workers, test_rank ranks, TLS and tokens) while a seeded random schedule kills, pauses and
// restarts ranks, workers and loomd, drops the workers' connections to loomd (they dial it
// through tests/support/tcp_proxy.h), and fills the disk of the shared checkpoint root (a small
// tmpfs, when this process may mount one). Afterwards the recorded history is checked:
//   - every job ends, and SUCCEEDED (restarts are plentiful);
//   - every transition in every job's event log is legal (jobs::IsTransitionAllowed);
//   - nothing ran twice at once: no rank started while a rank of an earlier generation of its
//     job was alive, and no (generation, rank) was launched twice;
//   - no committed step was lost: every generation resumed at or after the last step an earlier
//     generation committed (test_rank's history.log), and a SUCCEEDED job committed its last step.
// The figures (faults by kind, restarts, steps lost) are printed as one line per seed; the seeds
// come from LOOM_CHAOS_SEEDS (default "1,2"). A seed that fails is kept as a regression case by
// adding it to kRegressionSeeds.
#include <signal.h>
#include <sys/mount.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "server/jobs/job_state_machine.h"
#include "tests/integration/cluster.h"
#include "tests/support/tcp_proxy.h"

namespace loom::testing {
namespace {

constexpr int kJobs = 8;
constexpr int kSteps = 40;
constexpr int kStepMs = 50;
constexpr absl::Duration kFaultPhase = absl::Seconds(20);
// Seeds that once failed; they always run, beside LOOM_CHAOS_SEEDS.
constexpr int kRegressionSeeds[] = {1};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool Alive(long pid) {
  const std::string stat = Slurp("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
  return stat[paren + 2] != 'Z' && stat[paren + 2] != 'X';
}

// Every .started file of every job: (job index, parsed JSON).
std::vector<std::pair<int, nlohmann::json>> StartedFiles(const std::string& out) {
  std::vector<std::pair<int, nlohmann::json>> files;
  for (int i = 0; i < kJobs; ++i) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(absl::StrCat(out, "/", i), ec)) {
      if (e.path().extension() != ".started") continue;
      nlohmann::json j = nlohmann::json::parse(Slurp(e.path().string()), nullptr, false);
      if (j.is_object()) files.emplace_back(i, std::move(j));
    }
  }
  return files;
}

std::vector<long> AliveRanks(const std::string& out) {
  std::vector<long> pids;
  for (const auto& [job, j] : StartedFiles(out)) {
    const long pid = j.value("pid", 0L);
    if (pid > 0 && Alive(pid)) pids.push_back(pid);
  }
  return pids;
}

struct Figures {
  std::map<std::string, int> faults;
  int restarts = 0;
  int64_t steps_lost = 0;
  int succeeded = 0;
};

class ChaosRun {
 public:
  explicit ChaosRun(int seed) : seed_(seed), rng_(seed) {}

  void Run() {
    ClusterOptions options;
    options.workers = 2;
    options.cpu_devices_per_worker = 2;
    options.heartbeat_interval_ms = 200;
    options.node_timeout_ms = 2000;
    options.stop_grace_ms = 1000;
    // The workers reach loomd through a proxy that can drop their connections.
    proxy_ = std::make_unique<TcpProxy>([this] { return cluster_->loomd_port(); });
    ASSERT_TRUE(proxy_->Start());
    options.worker_coordinator = absl::StrCat("127.0.0.1:", proxy_->port());
    cluster_ = std::make_unique<Cluster>(options);
    ASSERT_TRUE(cluster_->Start().ok());
    out_ = cluster_->out_dir();
    shared_ = cluster_->dir() + "/shared";
    std::filesystem::create_directories(shared_);
    // A 4 MiB disk for the checkpoints, so that "disk full" can be injected.
    small_disk_ = mount("tmpfs", shared_.c_str(), "tmpfs", 0, "size=4m,mode=1777") == 0;
    if (!small_disk_) {
      std::cout << "[chaos] cannot mount a tmpfs (" << std::strerror(errno)
                << "): no disk-full faults in this run" << std::endl;
    }
    ASSERT_NO_FATAL_FAILURE(SubmitJobs());
    InjectFaults();
    ASSERT_NO_FATAL_FAILURE(WaitForTheEnd());
    Check();
    std::cout << "[chaos] seed " << seed_ << ": " << kJobs << " jobs, " << figures_.succeeded
              << " SUCCEEDED, faults {"
              << absl::StrJoin(figures_.faults, ", ", absl::PairFormatter("=")) << "}, restarts "
              << figures_.restarts << ", worker connections cut " << proxy_->dropped()
              << ", steps lost " << figures_.steps_lost << std::endl;
    for (long pid : AliveRanks(out_)) kill(static_cast<pid_t>(pid), SIGKILL);
    cluster_->Shutdown(/*keep_dir=*/true);
    if (small_disk_) umount2(shared_.c_str(), MNT_DETACH);
    if (!::testing::Test::HasFailure()) {
      std::error_code ec;
      std::filesystem::remove_all(cluster_->dir(), ec);
    }
  }

 private:
  void SubmitJobs() {
    for (int i = 0; i < kJobs; ++i) {
      const std::string out = absl::StrCat(out_, "/", i);
      std::filesystem::create_directories(out);
      const std::string yaml =
          absl::StrCat("name: chaos-", i, "\nmodel: {preset: tiny}\ndata: {builtin: tiny-corpus}\n",
                       "train: {steps: ", kSteps, "}\nresources: {cpu_devices: 2}\n",
                       "checkpoint: {dir: ", shared_, "/chaos-", i, "}\n",
                       "restart: {max_restarts: 100, backoff_seconds: 0.2}\n", "env:\n",
                       "  TEST_RANK_OUT_DIR: ", out, "\n  TEST_RANK_STEPS: ", kSteps,
                       "\n  TEST_RANK_STEP_MS: ", kStepMs, "\n  TEST_RANK_CHECKPOINT: 1\n");
      const std::string file = cluster_->WriteFile(absl::StrCat("chaos-", i, ".yaml"), yaml);
      const CommandResult r = cluster_->Loomctl({"submit", "-f", file, "-o", "json"});
      ASSERT_EQ(r.exit_code, 0) << r.Describe();
      const nlohmann::json job = nlohmann::json::parse(r.out, nullptr, false);
      ASSERT_TRUE(job.is_object()) << r.out;
      names_.push_back(job["name"].get<std::string>());
    }
  }

  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  void Sleep(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

  // One random fault every 0.5 to 2 s for kFaultPhase; each fault is over (the process is back
  // or resumed) before the next one.
  void InjectFaults() {
    const absl::Time end = absl::Now() + kFaultPhase;
    while (absl::Now() < end) {
      Sleep(Uniform(500, 2000));
      const int kind = Uniform(0, 99);
      if (kind < 33) {
        const std::vector<long> ranks = AliveRanks(out_);
        if (ranks.empty()) continue;
        kill(static_cast<pid_t>(ranks[Uniform(0, ranks.size() - 1)]), SIGKILL);
        ++figures_.faults["rank_killed"];
      } else if (kind < 50) {
        const std::vector<long> ranks = AliveRanks(out_);
        if (ranks.empty()) continue;
        const pid_t pid = static_cast<pid_t>(ranks[Uniform(0, ranks.size() - 1)]);
        kill(pid, SIGSTOP);
        Sleep(Uniform(200, 1500));
        kill(pid, SIGCONT);
        ++figures_.faults["rank_paused"];
      } else if (kind < 64) {
        const int w = Uniform(0, 1);
        cluster_->worker(w).Kill();
        Sleep(Uniform(100, 1000));
        EXPECT_TRUE(cluster_->StartWorker(w).ok()) << "worker " << w << " did not come back";
        ++figures_.faults["worker_killed"];
      } else if (kind < 74) {
        const int w = Uniform(0, 1);
        cluster_->worker(w).Signal(SIGSTOP);
        Sleep(Uniform(200, 1500));  // below and near the 2 s node timeout
        cluster_->worker(w).Signal(SIGCONT);
        ++figures_.faults["worker_paused"];
      } else if (kind < 80 && small_disk_) {
        FillTheDisk(Uniform(200, 1500));
        ++figures_.faults["disk_full"];
      } else if (kind < 86) {
        const int port = cluster_->loomd_port();
        cluster_->loomd().Kill();
        Sleep(Uniform(100, 1000));
        EXPECT_TRUE(cluster_->StartLoomd(port).ok()) << "loomd did not come back";
        ++figures_.faults["loomd_killed"];
      } else if (kind < 92) {
        cluster_->loomd().Signal(SIGSTOP);  // every connection to loomd stalls
        Sleep(Uniform(200, 1500));
        cluster_->loomd().Signal(SIGCONT);
        ++figures_.faults["loomd_paused"];
      } else {
        // The network drops the workers' sessions while loomd stays up: each worker reconnects
        // and loomd reconciles what it runs.
        proxy_->DropAll();
        ++figures_.faults["connections_dropped"];
      }
    }
  }

  // Fills the shared checkpoint disk for `ms`, then frees it: every commit in between fails.
  void FillTheDisk(int ms) {
    const std::string filler = shared_ + "/filler";
    {
      std::ofstream out(filler, std::ios::binary);
      const std::string block(64 << 10, 'x');
      for (int i = 0; i < 1024 && out.write(block.data(), block.size()); ++i) {
      }
    }
    Sleep(ms);
    std::filesystem::remove(filler);
  }

  void WaitForTheEnd() {
    const absl::Time deadline = absl::Now() + absl::Seconds(180);
    for (const std::string& name : names_) {
      while (true) {
        absl::StatusOr<v1::Job> job = cluster_->GetJob(name);
        if (job.ok() && jobs::IsTerminal(job->state())) {
          jobs_.push_back(*std::move(job));
          break;
        }
        ASSERT_LT(absl::Now(), deadline)
            << name << " did not end within 180 s after the faults: "
            << (job.ok() ? v1::JobState_Name(job->state()) + " " + job->state_reason()
                         : job.status().ToString());
        Sleep(200);
      }
    }
  }

  void Check() {
    for (const v1::Job& job : jobs_) {
      EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.name() << ": " << job.state_reason();
      if (job.state() == v1::SUCCEEDED) ++figures_.succeeded;
      figures_.restarts += job.restart_count();
      for (const v1::JobEvent& e : job.events()) {
        // The creation, and notices (same state: e.g. where a restarted gang resumed).
        if (e.from_state() == v1::JOB_STATE_UNSPECIFIED || e.from_state() == e.to_state()) {
          continue;
        }
        EXPECT_TRUE(jobs::IsTransitionAllowed(e.from_state(), e.to_state()))
            << job.name() << ": " << v1::JobState_Name(e.from_state()) << " -> "
            << v1::JobState_Name(e.to_state()) << " (" << e.reason() << ")";
      }
    }
    for (const auto& [i, started] : StartedFiles(out_)) {
      EXPECT_TRUE(started["earlier_generations_alive"].empty())
          << "job " << i << ": a rank of generation " << started["LOOM_JOB_GENERATION"]
          << " started while earlier ranks ran: " << started.dump();
      EXPECT_FALSE(started.value("launched_before", false))
          << "job " << i << ": launched twice: " << started.dump();
    }
    for (int i = 0; i < kJobs; ++i) CheckHistory(i);
  }

  // history.log: "resume G STEP" when rank 0 of generation G starts, "commit G STEP" after each
  // committed step, in the order they happened.
  void CheckHistory(int i) {
    std::map<int64_t, int64_t> last_commit;  // generation -> its last committed step
    int64_t final_commit = 0;
    for (absl::string_view line : absl::StrSplit(Slurp(absl::StrCat(out_, "/", i, "/history.log")),
                                                 '\n', absl::SkipEmpty())) {
      std::istringstream in{std::string(line)};
      std::string what;
      int64_t generation = 0, step = 0;
      in >> what >> generation >> step;
      if (what == "commit") {
        last_commit[generation] = std::max(last_commit[generation], step);
        final_commit = std::max(final_commit, step);
        continue;
      }
      int64_t committed_before = 0;
      for (const auto& [g, s] : last_commit) {
        if (g < generation) committed_before = std::max(committed_before, s);
      }
      if (step < committed_before) {
        figures_.steps_lost += committed_before - step;
        ADD_FAILURE() << "job " << i << ": generation " << generation << " resumed at step " << step
                      << " but step " << committed_before << " was committed before";
      }
    }
    if (i < static_cast<int>(jobs_.size()) && jobs_[i].state() == v1::SUCCEEDED) {
      EXPECT_EQ(final_commit, kSteps) << "job " << i << " SUCCEEDED without its last step";
    }
  }

  const int seed_;
  std::mt19937_64 rng_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<TcpProxy> proxy_;  // after cluster_: stopped first, it asks cluster_ for a port
  std::string out_;
  std::string shared_;
  bool small_disk_ = false;
  std::vector<std::string> names_;
  std::vector<v1::Job> jobs_;
  Figures figures_;
};

std::vector<int> Seeds() {
  std::vector<int> seeds(std::begin(kRegressionSeeds), std::end(kRegressionSeeds));
  const char* env = std::getenv("LOOM_CHAOS_SEEDS");
  for (absl::string_view s : absl::StrSplit(env != nullptr ? env : "2", ',', absl::SkipEmpty())) {
    const int seed = std::atoi(std::string(s).c_str());
    if (std::find(seeds.begin(), seeds.end(), seed) == seeds.end()) seeds.push_back(seed);
  }
  return seeds;
}

TEST(ChaosTest, SeededFaultsLoseNoStepAndRunNothingTwice) {
  for (int seed : Seeds()) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    ChaosRun(seed).Run();
  }
}

}  // namespace
}  // namespace loom::testing
