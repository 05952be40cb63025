// Supervisor with real child processes: /bin/sh scripts are the rank programs.
#include "worker/agent/supervisor.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/rank_event_recorder.h"
#include "worker/agent/node_identity.h"
#include "worker/agent/rank_environment.h"

namespace loom::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using testing::RankEventRecorder;
using Events = RankEventRecorder::Events;

// Alive and not a zombie.
bool ProcessAlive(pid_t pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = content.rfind(')');
  return paren == std::string::npos || paren + 2 >= content.size() || content[paren + 2] != 'Z';
}

bool WaitGone(pid_t pid, absl::Duration timeout = absl::Seconds(3)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (ProcessAlive(pid)) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class SupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "loom-sup-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    supervisor_.reset();  // stops whatever still runs
    std::filesystem::remove_all(dir_);
  }

  Supervisor& Start(const std::string& script, absl::Duration grace = absl::Seconds(2),
                    const std::string& program = "/bin/sh",
                    const std::function<void(SupervisorOptions&)>& edit = nullptr) {
    SupervisorOptions o;
    o.work_dir = dir_;
    o.rank_program = program;
    o.rank_args = {"-c", script};
    o.stop_grace = grace;
    o.devices = CpuDevices(4);
    o.inherited_env = {{"PATH", "/usr/bin:/bin"}};
    o.log_flush_interval = absl::Milliseconds(20);
    if (edit) edit(o);
    supervisor_ = std::make_unique<Supervisor>(o, &recorder_);
    EXPECT_TRUE(supervisor_->Start().ok());
    return *supervisor_;
  }

  static v1::Assignment Job(const std::string& name, int64_t generation, int ranks,
                            std::map<std::string, std::string> env = {}) {
    v1::Assignment a;
    a.set_job(absl::StrCat("jobs/", name));
    a.set_generation(generation);
    a.set_world_size(ranks);
    a.set_num_nodes(1);
    a.mutable_layout()->set_data(ranks);
    a.mutable_layout()->set_tensor(1);
    a.mutable_layout()->set_pipeline(1);
    a.mutable_layout()->set_micro_batch(1);
    a.mutable_layout()->set_num_micro_batches(1);
    a.set_rendezvous_address("127.0.0.1:9");
    for (int i = 0; i < ranks; ++i) {
      v1::RankAssignment* r = a.add_ranks();
      r->set_rank(i);
      r->set_local_rank(i);
      r->set_device_index(i);
      r->set_device_kind(v1::DEVICE_KIND_CPU);
    }
    for (auto& [k, v] : env) (*a.mutable_spec()->mutable_env())[k] = v;
    a.mutable_spec()->set_name(name);
    return a;
  }

  bool WaitExits(const std::string& job, int n, absl::Duration timeout = absl::Seconds(20)) {
    return recorder_.WaitFor([&](const Events& e) { return e.CountExits(job) >= n; }, timeout);
  }
  bool WaitRunning(const std::string& job, int n) {
    return recorder_.WaitFor([&](const Events& e) {
      int running = 0;
      for (const auto& s : e.statuses) {
        running += s.job() == job && s.phase() == v1::RANK_PHASE_RUNNING;
      }
      return running >= n;
    });
  }

  std::string dir_;
  RankEventRecorder recorder_;
  std::unique_ptr<Supervisor> supervisor_;
};

TEST_F(SupervisorTest, EnvironmentIsExactlyTheContract) {
  Supervisor& s = Start(R"(env > "$LOOM_WORK_DIR/env.$LOOM_RANK")");
  const v1::Assignment a = Job("envjob", 3, 2, {{"FOO", "bar baz"}});
  s.Assign(a);
  ASSERT_TRUE(WaitExits("jobs/envjob", 2));
  const std::string job_dir = dir_ + "/jobs/envjob";
  RankPaths paths{job_dir, job_dir + "/spec.json", job_dir + "/checkpoints"};
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(recorder_.Snapshot().Exit("jobs/envjob", rank)->exit_class(), v1::EXIT_CLASS_SUCCESS);
    std::map<std::string, std::string> got;
    std::istringstream in(ReadFile(absl::StrCat(job_dir, "/env.", rank)));
    for (std::string line; std::getline(in, line);) {
      const size_t eq = line.find('=');
      ASSERT_NE(eq, std::string::npos) << line;
      got[line.substr(0, eq)] = line.substr(eq + 1);
    }
    got.erase("PWD");  // added by the shell itself
    std::map<std::string, std::string> expected =
        BuildRankEnvironment(a, a.ranks(rank), paths, 30'000);
    expected["PATH"] = "/usr/bin:/bin";
    EXPECT_EQ(got, expected);
    EXPECT_EQ(got["LOOM_RANK"], absl::StrCat(rank));
    EXPECT_EQ(got["LOOM_JOB_GENERATION"], "3");
  }
  const std::string spec = ReadFile(job_dir + "/spec.json");
  EXPECT_THAT(spec, HasSubstr("\"name\": \"envjob\""));
  EXPECT_THAT(spec, HasSubstr("\"max_restarts\": 0"));  // defaults are printed
  EXPECT_TRUE(std::filesystem::is_directory(job_dir + "/checkpoints"));
}

// A CPU rank computes with its device's share of the node's cores unless the job says otherwise.
TEST_F(SupervisorTest, CpuRanksGetTheirShareOfTheCores) {
  Supervisor& s = Start(R"(echo "$OMP_NUM_THREADS $OPENBLAS_NUM_THREADS" > "$LOOM_WORK_DIR/t")",
                        absl::Seconds(2), "/bin/sh",
                        [](SupervisorOptions& o) { o.cpu_threads_per_device = 3; });
  s.Assign(Job("share", 1, 1));
  ASSERT_TRUE(WaitExits("jobs/share", 1));
  EXPECT_EQ(ReadFile(dir_ + "/jobs/share/t"), "3 3\n");
  s.Assign(Job("chosen", 1, 1, {{"OPENBLAS_NUM_THREADS", "1"}}));
  ASSERT_TRUE(WaitExits("jobs/chosen", 1));
  EXPECT_EQ(ReadFile(dir_ + "/jobs/chosen/t"), "3 1\n");
}

TEST_F(SupervisorTest, StdoutBecomesLogsAndProgressBecomesSteps) {
  Supervisor& s = Start(R"(
    echo out1; echo out2; echo err1 >&2
    echo '{"event":"step","rank":9,"step":1,"total_steps":2,"loss":2.5}' >&3
    echo 'garbage' >&3
    echo '{"event":"checkpoint","step":1,"dir":"x"}' >&3
    echo '{"event":"eval","step":1,"val_loss":2.25}' >&3
    printf 'no newline at end')");
  s.Assign(Job("logs", 1, 1));
  ASSERT_TRUE(WaitExits("jobs/logs", 1));
  const Events e = recorder_.Snapshot();
  EXPECT_THAT(e.Lines("jobs/logs", 0, "stdout"), ElementsAre("out1", "out2", "no newline at end"));
  EXPECT_THAT(e.Lines("jobs/logs", 0, "stderr"), ElementsAre("err1"));
  ASSERT_EQ(e.steps.size(), 3u);
  EXPECT_EQ(e.steps[0].job(), "jobs/logs");
  EXPECT_EQ(e.steps[0].generation(), 1);
  EXPECT_EQ(e.steps[0].rank(), 0);  // from the worker, not from the line
  EXPECT_EQ(e.steps[0].step(), 1);
  EXPECT_DOUBLE_EQ(e.steps[0].loss(), 2.5);
  EXPECT_TRUE(e.steps[1].checkpoint());
  EXPECT_TRUE(e.steps[2].has_val_loss());
  // RUNNING (once every rank of the gang has started), then EXITED.
  ASSERT_EQ(e.statuses.size(), 2u);
  EXPECT_EQ(e.statuses[0].phase(), v1::RANK_PHASE_RUNNING);
  EXPECT_GT(e.statuses[0].pid(), 0);
  EXPECT_EQ(e.statuses[1].phase(), v1::RANK_PHASE_EXITED);
  EXPECT_EQ(e.statuses[1].exit_class(), v1::EXIT_CLASS_SUCCESS);
  EXPECT_EQ(s.stats().launches, 1);
  EXPECT_EQ(s.stats().exits_success, 1);
}

TEST_F(SupervisorTest, ClassifiesExitCodesAndSignals) {
  Supervisor& s = Start(R"(
    echo "last words" >&2
    case "$MODE" in kill) kill -KILL $$ ;; *) exit "$MODE" ;; esac)");
  for (const char* mode : {"0", "2", "3", "kill"}) {
    s.Assign(Job(absl::StrCat("exit-", mode), 1, 1, {{"MODE", mode}}));
  }
  for (const char* mode : {"0", "2", "3", "kill"}) {
    ASSERT_TRUE(WaitExits(absl::StrCat("jobs/exit-", mode), 1)) << mode;
  }
  const Events e = recorder_.Snapshot();
  const v1::RankStatus* ok = e.Exit("jobs/exit-0", 0);
  EXPECT_EQ(ok->exit_class(), v1::EXIT_CLASS_SUCCESS);
  const v1::RankStatus* permanent = e.Exit("jobs/exit-2", 0);
  EXPECT_EQ(permanent->exit_class(), v1::EXIT_CLASS_PERMANENT);
  EXPECT_EQ(permanent->exit_code(), 2);
  EXPECT_EQ(permanent->message(), "exit code 2: last words");
  const v1::RankStatus* retry = e.Exit("jobs/exit-3", 0);
  EXPECT_EQ(retry->exit_class(), v1::EXIT_CLASS_RETRYABLE);
  EXPECT_EQ(retry->message(), "exit code 3: last words");
  const v1::RankStatus* killed = e.Exit("jobs/exit-kill", 0);
  EXPECT_EQ(killed->exit_class(), v1::EXIT_CLASS_RETRYABLE);
  EXPECT_EQ(killed->signal(), SIGKILL);
  EXPECT_EQ(killed->message(), "killed by signal 9 (SIGKILL): last words");
  const SupervisorStats stats = s.stats();
  EXPECT_EQ(stats.exits_success, 1);
  EXPECT_EQ(stats.exits_permanent, 1);
  EXPECT_EQ(stats.exits_retryable, 2);
}

TEST_F(SupervisorTest, OneRankFailingStopsTheOthers) {
  Supervisor& s = Start(R"(
    if [ "$LOOM_RANK" = 1 ]; then sleep 0.3; echo dying >&2; exit 3; fi
    exec sleep 60)");
  const absl::Time start = absl::Now();
  s.Assign(Job("gang", 1, 3));
  ASSERT_TRUE(WaitExits("jobs/gang", 3));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  const Events e = recorder_.Snapshot();
  EXPECT_EQ(e.Exit("jobs/gang", 1)->exit_class(), v1::EXIT_CLASS_RETRYABLE);
  EXPECT_EQ(e.Exit("jobs/gang", 1)->message(), "exit code 3: dying");
  for (int rank : {0, 2}) {
    const v1::RankStatus* st = e.Exit("jobs/gang", rank);
    EXPECT_EQ(st->exit_class(), v1::EXIT_CLASS_STOPPED);
    EXPECT_EQ(st->signal(), SIGTERM);
    EXPECT_THAT(st->message(), HasSubstr("rank 1 failed"));
    EXPECT_TRUE(WaitGone(st->pid()));
  }
  EXPECT_EQ(s.stats().exits_stopped, 2);
  EXPECT_THAT(s.RunningJobs(), IsEmpty());
}

TEST_F(SupervisorTest, CancelStopsEveryRank) {
  Supervisor& s = Start("exec sleep 60");
  s.Assign(Job("cancel", 4, 2));
  ASSERT_TRUE(WaitRunning("jobs/cancel", 2));
  std::vector<v1::RunningJob> running = s.RunningJobs();
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].job(), "jobs/cancel");
  EXPECT_EQ(running[0].generation(), 4);
  EXPECT_THAT(running[0].ranks(), ElementsAre(0, 1));
  s.Cancel("jobs/cancel", 3, "stale generation: ignored");
  s.Cancel("jobs/cancel", 4, "user asked");
  ASSERT_TRUE(WaitExits("jobs/cancel", 2));
  const Events e = recorder_.Snapshot();
  for (int rank : {0, 1}) {
    const v1::RankStatus* st = e.Exit("jobs/cancel", rank);
    EXPECT_EQ(st->exit_class(), v1::EXIT_CLASS_STOPPED);
    EXPECT_THAT(st->message(), HasSubstr("cancelled: user asked"));
  }
  EXPECT_THAT(s.RunningJobs(), IsEmpty());
}

// loomd's progress watchdog asks for stacks: a rank that answers SIGUSR1 (as loom-train does)
// has its dump captured from stderr; a stopped rank (SIGSTOP) is reported at once as not
// answering, with its process state T.
TEST_F(SupervisorTest, StackDumpsAreCapturedAndAStoppedRankIsReported) {
  Supervisor& s = Start(R"sh(
    trap 'echo "loom-train: stack dump (SIGUSR1), pid $$" >&2; echo "#0 Train()" >&2
          echo "last collectives: all_reduce #3" >&2; echo "loom-train: end of stack dump" >&2' USR1
    echo started >&2
    if [ "$LOOM_RANK" = 1 ]; then kill -STOP $$; fi
    while :; do sleep 0.05; done)sh");
  s.Assign(Job("dump", 1, 2));
  ASSERT_TRUE(recorder_.WaitFor(
      [](const Events& e) {
        return e.Lines("jobs/dump", 0, "stderr").size() == 1 &&
               e.Lines("jobs/dump", 1, "stderr").size() == 1;
      },
      absl::Seconds(10)));
  absl::SleepFor(absl::Milliseconds(200));  // rank 1 stops itself right after its line
  s.DumpStacks("jobs/dump", 2);             // another generation: ignored
  s.DumpStacks("jobs/dump", 1);
  ASSERT_TRUE(
      recorder_.WaitFor([](const Events& e) { return e.dumps.size() >= 2; }, absl::Seconds(10)));
  const Events e = recorder_.Snapshot();
  ASSERT_EQ(e.dumps.size(), 2u);
  const v1::StackDump& stopped = e.dumps[0].rank() == 1 ? e.dumps[0] : e.dumps[1];
  const v1::StackDump& answered = e.dumps[0].rank() == 0 ? e.dumps[0] : e.dumps[1];
  EXPECT_FALSE(stopped.answered());
  EXPECT_EQ(stopped.proc_state(), "T");
  EXPECT_GT(stopped.pid(), 0);
  EXPECT_TRUE(answered.answered());
  EXPECT_EQ(answered.generation(), 1);
  EXPECT_THAT(answered.text(), HasSubstr("last collectives: all_reduce #3"));
  EXPECT_THAT(answered.text(), HasSubstr("loom-train: end of stack dump"));
  // The dump is in the logs too, and the rank runs on.
  EXPECT_THAT(e.Lines("jobs/dump", 0, "stderr"), ::testing::Contains("#0 Train()"));
  EXPECT_EQ(e.CountExits("jobs/dump"), 0);
}

// A node that cannot create the job's directory says so with errno (loomd then avoids it for
// the job, and marks it unhealthy when the disk is full).
TEST_F(SupervisorTest, APrepareFailureIsReportedWithItsError) {
  Supervisor& s = Start("exit 0");
  // The (empty) jobs directory made at start becomes a file: the spare directory cannot be put
  // in place either, and the directory made on demand fails with the error reported.
  std::filesystem::remove(dir_ + "/jobs");
  std::ofstream(dir_ + "/jobs") << "a file where the jobs directory should be";
  s.Assign(Job("prep", 1, 1));
  ASSERT_TRUE(WaitExits("jobs/prep", 1));
  const Events e = recorder_.Snapshot();
  const v1::RankStatus* st = e.Exit("jobs/prep", 0);
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(st->exit_class(), v1::EXIT_CLASS_RETRYABLE);
  EXPECT_THAT(st->prepare_error(), HasSubstr("Not a directory (errno 20)"));
  EXPECT_FALSE(st->no_space());
}

// A gang starts in a directory made ahead of time (job_dir_pool.h), with its spec and its
// checkpoints/ in it, and the spare used is made again once the gang has ended; the same job's
// next generation finds its directory in place.
TEST_F(SupervisorTest, AGangStartsInADirectoryMadeAheadOfTime) {
  Supervisor& s = Start(R"(test -d "$LOOM_CHECKPOINT_DIR" && grep -q ahead \
                           "$LOOM_SPEC_FILE" && test "$PWD" = "$LOOM_WORK_DIR")");
  auto spares = [&] {
    int n = 0;
    for ([[maybe_unused]] const auto& e :
         std::filesystem::directory_iterator(dir_ + "/spare-job-dirs"))
      ++n;
    return n;
  };
  EXPECT_EQ(spares(), 2);
  s.Assign(Job("ahead", 1, 2));
  ASSERT_TRUE(WaitExits("jobs/ahead", 2));
  Events e = recorder_.Snapshot();
  for (int rank : {0, 1})
    EXPECT_EQ(e.Exit("jobs/ahead", rank)->exit_class(), v1::EXIT_CLASS_SUCCESS);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (spares() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(spares(), 2);
  s.Assign(Job("ahead", 2, 2));
  ASSERT_TRUE(WaitExits("jobs/ahead", 4));
  e = recorder_.Snapshot();
  int succeeded = 0;
  for (const v1::RankStatus& st : e.statuses) {
    succeeded += st.phase() == v1::RANK_PHASE_EXITED && st.exit_class() == v1::EXIT_CLASS_SUCCESS;
  }
  EXPECT_EQ(succeeded, 4);
}

TEST_F(SupervisorTest, RankIgnoringSigtermIsKilledAfterTheGrace) {
  Supervisor& s =
      Start(R"(trap '' TERM; echo ready; while :; do sleep 0.05; done)", absl::Milliseconds(500));
  s.Assign(Job("stubborn", 1, 1));
  ASSERT_TRUE(recorder_.WaitFor(
      [](const Events& e) { return !e.Lines("jobs/stubborn", 0, "stdout").empty(); }));
  const absl::Time start = absl::Now();
  s.Cancel("jobs/stubborn", 0, "test");
  ASSERT_TRUE(WaitExits("jobs/stubborn", 1));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(450));
  EXPECT_LT(took, absl::Seconds(5));
  const Events e = recorder_.Snapshot();
  const v1::RankStatus* st = e.Exit("jobs/stubborn", 0);
  EXPECT_EQ(st->signal(), SIGKILL);
  EXPECT_EQ(st->exit_class(), v1::EXIT_CLASS_STOPPED);
}

TEST_F(SupervisorTest, MissingProgramIsPermanent) {
  Supervisor& s = Start("", absl::Seconds(1), "/nonexistent/loom-train");
  s.Assign(Job("noexec", 1, 2));
  ASSERT_TRUE(WaitExits("jobs/noexec", 2));
  const Events e = recorder_.Snapshot();
  const v1::RankStatus* first = e.Exit("jobs/noexec", 0);
  EXPECT_EQ(first->exit_class(), v1::EXIT_CLASS_PERMANENT);
  EXPECT_EQ(first->exit_code(), 127);
  EXPECT_EQ(first->message(), "exec /nonexistent/loom-train: No such file or directory");
  // The gang's ranks are launched at once (launch_pool.h), so each reports its own failure.
  const v1::RankStatus* second = e.Exit("jobs/noexec", 1);
  EXPECT_EQ(second->exit_class(), v1::EXIT_CLASS_PERMANENT);
  EXPECT_EQ(second->message(), "exec /nonexistent/loom-train: No such file or directory");
  EXPECT_EQ(s.stats().launches, 0);
}

TEST_F(SupervisorTest, ShutdownLeavesNoProcessOfTheGroupAlive) {
  // Each rank leaves a grandchild that ignores SIGTERM: only the group SIGKILL ends it.
  Supervisor& s = Start(R"(
    sh -c 'trap "" TERM; exec sleep 300' &
    echo $! > "$LOOM_WORK_DIR/child.$LOOM_RANK"
    wait)");
  s.Assign(Job("orphans", 1, 2));
  ASSERT_TRUE(WaitRunning("jobs/orphans", 2));
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string file = absl::StrCat(dir_, "/jobs/orphans/child.", rank);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (ReadFile(file).empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    ASSERT_FALSE(ReadFile(file).empty()) << file;
    pids.push_back(std::stoi(ReadFile(file)));
  }
  for (const v1::RankStatus& st : recorder_.Snapshot().statuses) {
    if (st.phase() == v1::RANK_PHASE_RUNNING) pids.push_back(st.pid());
  }
  ASSERT_EQ(pids.size(), 4u);
  for (pid_t pid : pids) EXPECT_TRUE(ProcessAlive(pid)) << pid;
  s.Shutdown();
  const Events e = recorder_.Snapshot();
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_NE(e.Exit("jobs/orphans", rank), nullptr);
    EXPECT_EQ(e.Exit("jobs/orphans", rank)->exit_class(), v1::EXIT_CLASS_STOPPED);
  }
  for (pid_t pid : pids) EXPECT_TRUE(WaitGone(pid)) << pid;
  s.Assign(Job("after-shutdown", 1, 1));  // ignored, not a crash
}

TEST_F(SupervisorTest, RepeatedAndNewerGenerations) {
  Supervisor& s = Start("exec sleep 60");
  s.Assign(Job("gen", 1, 1));
  ASSERT_TRUE(WaitRunning("jobs/gen", 1));
  s.Assign(Job("gen", 1, 1));  // the same generation again: nothing happens
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(s.stats().launches, 1);
  s.Assign(Job("gen", 2, 1));  // newer: generation 1 is stopped first
  ASSERT_TRUE(WaitRunning("jobs/gen", 2));
  s.Assign(Job("gen", 1, 1));  // stale: ignored
  absl::SleepFor(absl::Milliseconds(200));
  const Events e = recorder_.Snapshot();
  ASSERT_EQ(e.CountExits("jobs/gen"), 1);
  const v1::RankStatus* old = e.Exit("jobs/gen", 0);
  EXPECT_EQ(old->generation(), 1);
  EXPECT_EQ(old->exit_class(), v1::EXIT_CLASS_STOPPED);
  EXPECT_THAT(old->message(), HasSubstr("superseded by generation 2"));
  // Generation 2 started only after generation 1 had exited.
  int exit_index = -1, second_run_index = -1;
  for (size_t i = 0; i < e.statuses.size(); ++i) {
    if (e.statuses[i].phase() == v1::RANK_PHASE_EXITED) exit_index = static_cast<int>(i);
    if (e.statuses[i].generation() == 2 && e.statuses[i].phase() == v1::RANK_PHASE_RUNNING) {
      second_run_index = static_cast<int>(i);
    }
  }
  EXPECT_LT(exit_index, second_run_index);
  std::vector<v1::RunningJob> running = s.RunningJobs();
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].generation(), 2);
  EXPECT_EQ(s.stats().launches, 2);
}

TEST_F(SupervisorTest, InvalidAssignmentsArePermanentFailures) {
  Supervisor& s = Start("exit 0");
  v1::Assignment dup = Job("dup", 1, 2);
  dup.mutable_ranks(1)->set_rank(0);
  s.Assign(dup);
  v1::Assignment unknown_device = Job("nodev", 1, 1);
  unknown_device.mutable_ranks(0)->set_device_index(42);
  s.Assign(unknown_device);
  v1::Assignment absurd = Job("absurd", 1, 1);
  absurd.set_world_size(2000000000);
  s.Assign(absurd);
  ASSERT_TRUE(WaitExits("jobs/dup", 1));
  ASSERT_TRUE(WaitExits("jobs/nodev", 1));
  ASSERT_TRUE(WaitExits("jobs/absurd", 1));
  const Events e = recorder_.Snapshot();
  EXPECT_EQ(e.CountExits("jobs/dup"), 1);  // one status per distinct rank
  EXPECT_EQ(e.Exit("jobs/dup", 0)->exit_class(), v1::EXIT_CLASS_PERMANENT);
  EXPECT_THAT(e.Exit("jobs/dup", 0)->message(), HasSubstr("appears twice"));
  EXPECT_THAT(e.Exit("jobs/nodev", 0)->message(), HasSubstr("cpu:42 does not exist"));
  EXPECT_THAT(e.Exit("jobs/absurd", 0)->message(), HasSubstr("world_size"));
  EXPECT_EQ(s.stats().launches, 0);
}

TEST_F(SupervisorTest, FinishedGenerationIsNotLaunchedTwice) {
  Supervisor& s = Start("exit 0");
  s.Assign(Job("once", 1, 1));
  ASSERT_TRUE(WaitExits("jobs/once", 1));
  s.Assign(Job("once", 1, 1));  // e.g. from a loomd that lost the exit: re-sent, not re-run
  ASSERT_TRUE(WaitExits("jobs/once", 2));
  const Events e = recorder_.Snapshot();
  EXPECT_EQ(s.stats().launches, 1);
  EXPECT_EQ(e.statuses.back().exit_class(), v1::EXIT_CLASS_SUCCESS);
}

// A given checkpoint.dir gets the job's own folder, so jobs sharing a dir never meet; paths are
// confined to the worker's roots with links resolved, and a refusal is a permanent failure that
// launches nothing.
TEST_F(SupervisorTest, CheckpointDirIsPrivateToTheJobAndConfinedToTheRoots) {
  const std::string shared = dir_ + "/shared";
  std::filesystem::create_directories(dir_ + "/outside");
  Supervisor& s = Start(R"(echo "$LOOM_CHECKPOINT_DIR" > "$LOOM_WORK_DIR/ckpt")", absl::Seconds(2),
                        "/bin/sh", [&](SupervisorOptions& o) { o.roots.checkpoint = {shared}; });
  v1::Assignment a = Job("ckjob", 1, 1);
  a.mutable_spec()->mutable_checkpoint()->set_dir(shared);
  s.Assign(a);
  ASSERT_TRUE(WaitExits("jobs/ckjob", 1));
  EXPECT_EQ(recorder_.Snapshot().Exit("jobs/ckjob", 0)->exit_class(), v1::EXIT_CLASS_SUCCESS);
  EXPECT_EQ(ReadFile(dir_ + "/jobs/ckjob/ckpt"), shared + "/ckjob\n");
  EXPECT_TRUE(std::filesystem::is_directory(shared + "/ckjob"));

  std::filesystem::create_directory_symlink(dir_ + "/outside", shared + "/link");
  v1::Assignment escape = Job("escape", 1, 1);
  escape.mutable_spec()->mutable_checkpoint()->set_dir(shared + "/link");
  s.Assign(escape);
  ASSERT_TRUE(WaitExits("jobs/escape", 1));
  const Events e = recorder_.Snapshot();
  EXPECT_EQ(e.Exit("jobs/escape", 0)->exit_class(), v1::EXIT_CLASS_PERMANENT);
  EXPECT_THAT(e.Exit("jobs/escape", 0)->message(), HasSubstr("spec.checkpoint.dir"));
  EXPECT_THAT(e.Exit("jobs/escape", 0)->message(), HasSubstr("symbolic link"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/outside/escape"));
  EXPECT_EQ(s.stats().launches, 1);
}

// Once ranks ran in a work dir, it is theirs: what they leave there (a link at the spec's temp
// file, a link in place of the checkpoint folder) never steers the worker's own writes.
TEST_F(SupervisorTest, LinksLeftInTheWorkDirAreNotFollowed) {
  const std::string victim = dir_ + "/victim";
  std::ofstream(victim) << "precious";
  const std::string job_dir = dir_ + "/jobs/linked";
  std::filesystem::create_directories(job_dir);
  std::filesystem::create_symlink(victim, job_dir + "/spec.json.tmp");
  Supervisor& s = Start("exit 0");
  s.Assign(Job("linked", 1, 1));
  ASSERT_TRUE(WaitExits("jobs/linked", 1));
  EXPECT_EQ(recorder_.Snapshot().Exit("jobs/linked", 0)->exit_class(), v1::EXIT_CLASS_SUCCESS);
  EXPECT_EQ(ReadFile(victim), "precious");
  EXPECT_THAT(ReadFile(job_dir + "/spec.json"), HasSubstr("\"name\": \"linked\""));
}

// A root worker runs its ranks as an unprivileged user, which owns the job's folders.
TEST_F(SupervisorTest, RanksRunAsTheRankUserAndOwnTheirFolders) {
  if (::geteuid() != 0) GTEST_SKIP() << "switching users needs root";
  absl::StatusOr<RankIdentity> nobody = ResolveRankUser("", 0);
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  ASSERT_TRUE(nobody->switch_user);
  // The rank must reach its work dir below the test's private temp dir.
  std::filesystem::permissions(dir_, std::filesystem::perms::owner_all |
                                         std::filesystem::perms::others_exec |
                                         std::filesystem::perms::group_exec);
  Supervisor& s = Start(
      R"(id -u > "$LOOM_WORK_DIR/uid" && id -G > "$LOOM_WORK_DIR/groups" &&
         touch "$LOOM_CHECKPOINT_DIR/written")",
      absl::Seconds(2), "/bin/sh", [&](SupervisorOptions& o) { o.rank_user = *nobody; });
  s.Assign(Job("asnobody", 1, 1));
  ASSERT_TRUE(WaitExits("jobs/asnobody", 1));
  const Events e = recorder_.Snapshot();
  EXPECT_EQ(e.Exit("jobs/asnobody", 0)->exit_class(), v1::EXIT_CLASS_SUCCESS)
      << e.Exit("jobs/asnobody", 0)->message();
  const std::string job_dir = dir_ + "/jobs/asnobody";
  EXPECT_EQ(ReadFile(job_dir + "/uid"), absl::StrCat(nobody->uid, "\n"));
  std::istringstream groups(ReadFile(job_dir + "/groups"));
  int group_count = 0;
  for (std::string group; groups >> group; ++group_count) EXPECT_NE(group, "0");  // not root's
  EXPECT_GE(group_count, 1);
  EXPECT_TRUE(std::filesystem::exists(job_dir + "/checkpoints/written"));
  struct stat info {};
  ASSERT_EQ(::stat(job_dir.c_str(), &info), 0);
  EXPECT_EQ(info.st_uid, nobody->uid);
  // The rank starts in the worker's address space until it execs (launcher.h): its change of
  // user must reach no thread of the worker.
  int threads = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::istringstream status(ReadFile(task.path().string() + "/status"));
    for (std::string line; std::getline(status, line);) {
      if (absl::StartsWith(line, "Uid:")) {
        EXPECT_EQ(line, "Uid:\t0\t0\t0\t0") << "thread " << task.path().filename();
        ++threads;
      }
    }
  }
  EXPECT_GE(threads, 2);  // the test's and the supervisor's at least
}

}  // namespace
}  // namespace loom::worker
