// The loom-worker binary end to end against an in-process fake loomd: flags, ready file,
// assignment, and the two ways a worker ends — SIGTERM (ranks stopped and reported, exit 0) and
// SIGKILL (ranks die with it through PR_SET_PDEATHSIG). LOOM_WORKER_BIN is set by CMake.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/ready_file.h"
#include "gtest/gtest.h"
#include "tests/support/child_signals.h"
#include "tests/worker/fake_node_service.h"

extern char** environ;

namespace loom::worker {
namespace {

using testing::FakeServer;
using testing::FindStatus;

bool ProcessAlive(pid_t pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = content.rfind(')');
  return paren == std::string::npos || paren + 2 >= content.size() || content[paren + 2] != 'Z';
}

bool WaitGone(pid_t pid, absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (ProcessAlive(pid)) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

class WorkerBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "loom-wbin-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    // Run as root, loom-worker runs its ranks as nobody by default: they must reach the script.
    ::chmod(dir_.c_str(), 0755);
    rank_script_ = dir_ + "/rank.sh";
    std::ofstream(rank_script_) << "#!/bin/sh\necho \"rank $LOOM_RANK on $LOOM_DEVICE\"\n"
                                   "exec sleep 60\n";
    ::chmod(rank_script_.c_str(), 0755);
    ASSERT_TRUE(server_.Start(0));
  }
  void TearDown() override {
    if (worker_pid_ > 0) {
      ::kill(worker_pid_, SIGKILL);
      ::waitpid(worker_pid_, nullptr, 0);
    }
    server_.Stop();
    std::filesystem::remove_all(dir_);
  }

  // Starts loom-worker with its output in <dir>/worker.log and waits for its ready file.
  // `measure`: --measure-devices (the rank script then answers --measure-device).
  void StartWorker(bool measure = false) {
    const std::vector<std::string> args = {
        LOOM_WORKER_BIN,
        measure ? "--measure-devices=true" : "--measure-devices=false",
        absl::StrCat("--coordinator=127.0.0.1:", server_.port),
        "--work-dir=" + dir_ + "/work",
        "--ready-file=" + dir_ + "/ready.json",
        "--rank-program=" + rank_script_,
        "--cpu-devices=2",
        "--name=binary-test",
        "--stop-grace-ms=2000"};
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    const std::string log = dir_ + "/worker.log";
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    // The worker starts as from an ordinary shell, whatever signals this test inherited.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    ASSERT_EQ(::loom::testing::SetDefaultSignals(&attr), 0);
    ASSERT_EQ(posix_spawn(&worker_pid_, argv[0], &actions, &attr, argv.data(), environ), 0);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    absl::StatusOr<std::map<std::string, std::string>> ready;
    while (!(ready = ReadReadyFile(dir_ + "/ready.json")).ok() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_TRUE(ready.ok()) << ready.status();
    EXPECT_EQ((*ready)["pid"], absl::StrCat(worker_pid_));
    EXPECT_FALSE((*ready)["grpc"].empty());
    EXPECT_FALSE((*ready)["metrics"].empty());
  }

  // Assigns a two-rank job and returns the rank pids once both run.
  std::vector<pid_t> RunJob(const std::string& name) {
    v1::CoordinatorMessage m;
    v1::Assignment& a = *m.mutable_assign();
    a.set_job("jobs/" + name);
    a.set_generation(1);
    a.set_world_size(2);
    a.set_num_nodes(1);
    a.mutable_layout()->set_data(2);
    a.mutable_layout()->set_tensor(1);
    a.mutable_layout()->set_pipeline(1);
    for (int i = 0; i < 2; ++i) {
      v1::RankAssignment* r = a.add_ranks();
      r->set_rank(i);
      r->set_local_rank(i);
      r->set_device_index(i);
      r->set_device_kind(v1::DEVICE_KIND_CPU);
    }
    server_.service.Send(m);
    const std::string job = "jobs/" + name;
    EXPECT_TRUE(server_.service.WaitFor([&](const auto&, const auto& received) {
      return FindStatus(received, job, v1::RANK_PHASE_RUNNING, 0) != nullptr &&
             FindStatus(received, job, v1::RANK_PHASE_RUNNING, 1) != nullptr;
    }));
    std::vector<pid_t> pids;
    const auto received = server_.service.Received();
    for (int rank : {0, 1}) {
      const v1::RankStatus* s = FindStatus(received, job, v1::RANK_PHASE_RUNNING, rank);
      if (s != nullptr) pids.push_back(s->pid());
    }
    return pids;
  }

  std::string dir_, rank_script_;
  FakeServer server_;
  pid_t worker_pid_ = -1;
};

// Writes a rank script that answers `--measure-device` with `line` (and runs as before else).
void WriteMeasuringRankScript(const std::string& path, const std::string& line) {
  std::ofstream(path) << "#!/bin/sh\nif [ \"$1\" = --measure-device ]; then echo '" << line
                      << "'; exit 0; fi\nexec sleep 60\n";
  ::chmod(path.c_str(), 0755);
}

TEST_F(WorkerBinaryTest, RegistersItsCpuDevicesWithTheFiguresItMeasured) {
  WriteMeasuringRankScript(
      rank_script_,
      R"({"event":"device_peaks","device":"cpu","gemm":[{"rows":1024,"inner":64,"cols":64,)"
      R"("flops_per_second":2.5e10}],"blocks":[{"hidden":64,"heads":4,"seq_len":64,)"
      R"("micro_batch":16,"seconds":0.03}],"optimizer_bytes_per_second":4e9,"threads":2,)"
      R"("measure_seconds":1.5})");
  StartWorker(/*measure=*/true);
  ASSERT_TRUE(server_.service.WaitFor([](const auto& regs, const auto&) { return !regs.empty(); }));
  v1::RegisterNodeRequest reg;
  server_.service.WaitFor([&](const auto& regs, const auto&) {
    reg = regs.front();
    return true;
  });
  ASSERT_EQ(reg.devices_size(), 2);
  for (const v1::Device& d : reg.devices()) {
    ASSERT_TRUE(d.has_peaks()) << d.DebugString();
    ASSERT_EQ(d.peaks().gemm_size(), 1);
    EXPECT_EQ(d.peaks().gemm(0).inner(), 64);
    EXPECT_DOUBLE_EQ(d.peaks().gemm(0).flops_per_second(), 2.5e10);
    ASSERT_EQ(d.peaks().blocks_size(), 1);
    EXPECT_DOUBLE_EQ(d.peaks().blocks(0).seconds(), 0.03);
    EXPECT_DOUBLE_EQ(d.peaks().optimizer_bytes_per_second(), 4e9);
    EXPECT_EQ(d.peaks().threads(), 2);
  }
}

TEST_F(WorkerBinaryTest, AMeasurementThatPrintsNonsenseRegistersWithoutFigures) {
  WriteMeasuringRankScript(rank_script_, R"({"event":"device_peaks","gemm":"fast"})");
  StartWorker(/*measure=*/true);
  ASSERT_TRUE(server_.service.WaitFor([](const auto& regs, const auto&) { return !regs.empty(); }));
  server_.service.WaitFor([&](const auto& regs, const auto&) {
    EXPECT_EQ(regs.front().devices_size(), 2);
    for (const v1::Device& d : regs.front().devices()) EXPECT_FALSE(d.has_peaks());
    return true;
  });
}

TEST_F(WorkerBinaryTest, SigtermStopsAndReportsEveryRank) {
  StartWorker();
  const std::vector<pid_t> pids = RunJob("term");
  ASSERT_EQ(pids.size(), 2u);
  for (pid_t pid : pids) EXPECT_TRUE(ProcessAlive(pid));
  ASSERT_EQ(::kill(worker_pid_, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(worker_pid_, &status, 0), worker_pid_);
  worker_pid_ = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (pid_t pid : pids) EXPECT_TRUE(WaitGone(pid)) << pid;
  const auto received = server_.service.Received();
  for (int rank : {0, 1}) {
    const v1::RankStatus* exit = FindStatus(received, "jobs/term", v1::RANK_PHASE_EXITED, rank);
    ASSERT_NE(exit, nullptr) << rank;
    EXPECT_EQ(exit->exit_class(), v1::EXIT_CLASS_STOPPED);
  }
}

TEST_F(WorkerBinaryTest, SigkillOfTheWorkerLeavesNoOrphan) {
  StartWorker();
  const std::vector<pid_t> pids = RunJob("kill");
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(::kill(worker_pid_, SIGKILL), 0);
  ASSERT_EQ(::waitpid(worker_pid_, nullptr, 0), worker_pid_);
  worker_pid_ = -1;
  for (pid_t pid : pids) EXPECT_TRUE(WaitGone(pid)) << pid;
}

}  // namespace
}  // namespace loom::worker
