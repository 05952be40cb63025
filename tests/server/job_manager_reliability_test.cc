// JobManager watchdogs, node faults and node administration, without a network: MemoryJobStore,
// FakeClock, and FakeSinks in place of the workers' sessions. Each test reproduces a failure of
// issue 10's list (a stopped rank unnoticed, a gang that never starts holding devices, a full
// disk retried on the same node, a node that cannot be removed, unknown gangs killed after a
// fresh start) and checks what happens now.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/jobs/default_spec_validator.h"
#include "server/jobs/job_manager.h"
#include "server/metrics/server_metrics.h"
#include "server/store/job_store.h"
#include "tests/server/loomd_test_util.h"
#include "tests/server/store_test_util.h"

namespace loom::jobs {
namespace {

using ::loom::testing::CpuNode;
using ::loom::testing::CpuSpec;
using ::loom::testing::CreateRequest;
using ::loom::testing::FakeSink;
using ::loom::testing::RankExit;
using ::loom::testing::RankPhase;
using ::loom::testing::Step;
using ::testing::HasSubstr;

constexpr char kRendezvous[] = "loomd.test:7070";

class ReliabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = store::NewMemoryJobStore();
    options_.rendezvous_address = kRendezvous;
    options_.node_timeout = absl::Hours(1);  // liveness is not what these tests are about
    options_.progress_timeout_floor = absl::Seconds(10);
    options_.progress_timeout_factor = 5;
    options_.startup_allowance = absl::Seconds(30);
    options_.stack_dump_grace = absl::Seconds(3);
    options_.start_timeout = absl::Seconds(60);
    options_.drain_requeue_delay = absl::Seconds(5);
    NewManager();
  }

  void NewManager(server_metrics::ServerMetrics* metrics = nullptr) {
    manager_.reset();
    auto manager = JobManager::Create(store_.get(), &clock_, MakeSpecValidator(), nullptr, nullptr,
                                      metrics, options_);
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = std::move(*manager);
  }

  std::shared_ptr<FakeSink> Connect(const std::string& id, int devices,
                                    v1::SessionHello hello = {}) {
    EXPECT_TRUE(manager_->RegisterNode(CpuNode(id, devices)).ok());
    auto sink = std::make_shared<FakeSink>();
    hello.set_node_id(id);
    absl::StatusOr<uint64_t> session = manager_->OpenSession(hello, sink);
    EXPECT_TRUE(session.ok()) << session.status();
    sessions_[id] = session.value_or(0);
    return sink;
  }
  // The node's worker restarted: its session ended (a live node id cannot be registered again),
  // and it registers anew and says hello.
  bool Reregister(const std::string& id, int devices) {
    if (auto it = sessions_.find(id); it != sessions_.end()) manager_->CloseSession(id, it->second);
    Connect(id, devices);
    return !::testing::Test::HasFailure();
  }
  void Send(const std::string& node, const v1::WorkerMessage& message) {
    absl::Status status = manager_->HandleWorkerMessage(node, sessions_[node], message);
    ASSERT_TRUE(status.ok()) << status;
  }
  v1::Job Get(const std::string& name) {
    absl::StatusOr<v1::Job> job = manager_->GetJob(name);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.value_or(v1::Job());
  }
  std::string Create(const v1::JobSpec& spec) {
    absl::StatusOr<v1::Job> job = manager_->CreateJob(CreateRequest(spec));
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->name() : "";
  }
  // A one-rank job started and RUNNING on `node`.
  std::string RunningJob(const std::string& node, int max_restarts = 0) {
    const std::string name = Create(CpuSpec(1, max_restarts));
    Send(node, RankPhase(name, 1, 0, v1::RANK_PHASE_RUNNING));
    EXPECT_EQ(Get(name).state(), v1::RUNNING);
    return name;
  }
  v1::WorkerMessage TimedStep(const std::string& job, int64_t generation, int64_t step,
                              double seconds) {
    v1::WorkerMessage m = Step(job, generation, 0, step, 100, 3.0);
    m.mutable_step()->set_step_seconds(seconds);
    return m;
  }
  void Tick(absl::Duration d) {
    clock_.Advance(d);
    manager_->Tick();
  }
  static std::vector<v1::DumpStacks> Dumps(FakeSink& sink) {
    std::vector<v1::DumpStacks> out;
    for (const v1::CoordinatorMessage& m : sink.Take()) {
      if (m.has_dump_stacks()) out.push_back(m.dump_stacks());
    }
    return out;
  }
  static std::vector<v1::CancelAssignment> Cancels(const std::vector<v1::CoordinatorMessage>& ms) {
    std::vector<v1::CancelAssignment> out;
    for (const v1::CoordinatorMessage& m : ms) {
      if (m.has_cancel()) out.push_back(m.cancel());
    }
    return out;
  }
  std::string LastReason(const std::string& name) {
    const v1::Job job = Get(name);
    return job.events().empty() ? "" : job.events(job.events_size() - 1).reason();
  }
  v1::Node NodeNamed(const std::string& name) {
    const v1::ListNodesResponse listed = manager_->ListNodes();
    for (const v1::Node& node : listed.nodes()) {
      if (node.name() == name) return node;
    }
    return v1::Node();
  }

  FakeClock clock_;
  JobManagerOptions options_;
  std::unique_ptr<store::JobStore> store_;
  std::unique_ptr<JobManager> manager_;
  std::map<std::string, uint64_t> sessions_;
};

// ---- Progress watchdog -------------------------------------------------------------------------

// The issue: a stopped (SIGSTOP) single-rank job stayed RUNNING forever. Now: silence past the
// floor asks for the stacks; the worker's answer (the rank did not answer, state T) ends up in the
// restart's event.
TEST_F(ReliabilityTest, AStoppedRankIsDetectedDumpedAndRestarted) {
  auto sink = Connect("n1", 1);
  const std::string name = RunningJob("n1", /*max_restarts=*/1);
  sink->Take();
  for (int s = 1; s <= 4; ++s) Send("n1", TimedStep(name, 1, s, 0.5));
  Tick(absl::Seconds(9));
  EXPECT_TRUE(Dumps(*sink).empty()) << "within the floor";
  Tick(absl::Seconds(2));
  std::vector<v1::DumpStacks> dumps = Dumps(*sink);
  ASSERT_EQ(dumps.size(), 1u);
  EXPECT_EQ(dumps[0].job(), name);
  EXPECT_EQ(dumps[0].generation(), 1);
  EXPECT_EQ(Get(name).state(), v1::RUNNING) << "the gang waits for its dumps first";

  v1::WorkerMessage answer;
  v1::StackDump* dump = answer.mutable_stack_dump();
  dump->set_job(name);
  dump->set_generation(1);
  dump->set_rank(0);
  dump->set_pid(4242);
  dump->set_answered(false);
  dump->set_proc_state("T");
  Send("n1", answer);  // every rank answered: no need to wait for the grace
  const v1::Job job = Get(name);
  EXPECT_EQ(job.state(), v1::RESTARTING);
  EXPECT_EQ(job.restart_count(), 1);
  EXPECT_THAT(LastReason(name), HasSubstr("no progress (step or checkpoint) for 11s"));
  EXPECT_THAT(LastReason(name),
              HasSubstr("rank 0 (pid 4242): did not answer, process state T (stopped)"));
  EXPECT_EQ(Cancels(sink->Take()).size(), 1u);
}

// A stopped rank in a larger job: the others may still report (or block in a collective); the
// silent rank is found by itself, named, and the gang restarts well before any collective
// timeout.
TEST_F(ReliabilityTest, ASilentRankInALargerGangIsNamed) {
  auto sink = Connect("n1", 2);
  const std::string name = Create(CpuSpec(2, /*max_restarts=*/1));
  for (int r = 0; r < 2; ++r) Send("n1", RankPhase(name, 1, r, v1::RANK_PHASE_RUNNING));
  for (int s = 1; s <= 3; ++s) {
    for (int r = 0; r < 2; ++r) {
      v1::WorkerMessage m = TimedStep(name, 1, s, 0.5);
      m.mutable_step()->set_rank(r);
      Send("n1", m);
    }
  }
  sink->Take();
  for (int s = 4; s <= 14; ++s) {  // rank 0 goes on, rank 1 is silent
    Tick(absl::Seconds(1));
    Send("n1", TimedStep(name, 1, s, 0.5));
  }
  EXPECT_EQ(Dumps(*sink).size(), 1u);
  Tick(absl::Seconds(3));
  EXPECT_EQ(Get(name).state(), v1::RESTARTING);
  EXPECT_THAT(LastReason(name), HasSubstr("rank 1: no progress (step or checkpoint) for 11s"));
}

// Before its first step a gang has the start-up allowance, not the floor; a worker that never
// answers the dump request does not keep the gang alive past the grace.
TEST_F(ReliabilityTest, BeforeTheFirstStepTheStartupAllowanceApplies) {
  auto sink = Connect("n1", 1);
  const std::string name = RunningJob("n1");
  sink->Take();
  Tick(absl::Seconds(25));
  EXPECT_TRUE(Dumps(*sink).empty()) << "past the floor, within the allowance";
  Tick(absl::Seconds(6));
  EXPECT_EQ(Dumps(*sink).size(), 1u);
  Tick(absl::Seconds(3));
  EXPECT_EQ(Get(name).state(), v1::FAILED) << "no restart left";
  EXPECT_THAT(LastReason(name), HasSubstr("the start-up allowance, no step yet"));
  EXPECT_THAT(LastReason(name), HasSubstr("rank 0: no answer from its worker"));
}

// Checkpoint events are progress: a checkpoint longer than the floor is not a hang.
TEST_F(ReliabilityTest, CheckpointReportsCountAsProgress) {
  auto sink = Connect("n1", 1);
  const std::string name = RunningJob("n1");
  Send("n1", TimedStep(name, 1, 1, 0.5));
  sink->Take();
  for (int i = 0; i < 5; ++i) {
    Tick(absl::Seconds(8));
    v1::WorkerMessage checkpoint = TimedStep(name, 1, 1, 0);
    checkpoint.mutable_step()->set_checkpoint(true);
    Send("n1", checkpoint);
  }
  EXPECT_TRUE(Dumps(*sink).empty());
  EXPECT_EQ(Get(name).state(), v1::RUNNING);
  EXPECT_EQ(Get(name).progress().step(), 1) << "a checkpoint report is not a step";
}

// The timeout follows the measured step time: 5 x a 6 s median step is 30 s, not the 10 s floor.
TEST_F(ReliabilityTest, TheTimeoutScalesWithTheMedianStep) {
  auto sink = Connect("n1", 1);
  const std::string name = RunningJob("n1");
  for (int s = 1; s <= 6; ++s) Send("n1", TimedStep(name, 1, s, 6.0));
  sink->Take();
  Tick(absl::Seconds(29));
  EXPECT_TRUE(Dumps(*sink).empty());
  Tick(absl::Seconds(2));
  EXPECT_EQ(Dumps(*sink).size(), 1u);
  Tick(absl::Seconds(3));
  EXPECT_THAT(LastReason(name), HasSubstr("timeout 30s: 5 x the median step of 6s"));
}

// ---- Start timeout -----------------------------------------------------------------------------

// The issue: a worker that accepted an assignment and never started it held the devices while
// the job stayed SCHEDULED. Now the gang is re-placed elsewhere after the start timeout, without
// spending a restart.
TEST_F(ReliabilityTest, AGangThatNeverStartsIsRePlacedOnAnotherNode) {
  auto a = Connect("a", 1);
  auto b = Connect("b", 2);
  const std::string name = Create(CpuSpec(1));  // best fit: a
  ASSERT_EQ(a->TakeAssignments().size(), 1u);
  Tick(absl::Seconds(59));
  EXPECT_EQ(Get(name).state(), v1::SCHEDULED);
  Tick(absl::Seconds(2));
  v1::Job job = Get(name);
  EXPECT_EQ(job.state(), v1::SCHEDULED) << "re-queued and placed at once";
  EXPECT_EQ(job.generation(), 2);
  EXPECT_EQ(job.restart_count(), 0);
  ASSERT_EQ(job.placements_size(), 1);
  EXPECT_EQ(job.placements(0).node(), "nodes/b");
  EXPECT_EQ(Cancels(a->Take()).size(), 1u);
  EXPECT_EQ(b->TakeAssignments().size(), 1u);
  bool found = false;
  for (const v1::JobEvent& e : job.events()) {
    found = found || absl::StrContains(e.reason(),
                                       "not every rank started within 1m (late: "
                                       "nodes/a)");
  }
  EXPECT_TRUE(found);
}

// ---- Storage faults on a node ------------------------------------------------------------------

// The issue: a full work dir rescheduled the job onto the same node three times. Now the node is
// marked unhealthy (nothing more lands there) and the job goes elsewhere without a restart spent.
TEST_F(ReliabilityTest, ANodeWithAFullDiskIsAvoidedAndMarkedUnhealthy) {
  auto a = Connect("a", 1);
  auto b = Connect("b", 2);
  const std::string name = Create(CpuSpec(1, /*max_restarts=*/3));
  ASSERT_EQ(Get(name).placements(0).node(), "nodes/a");
  v1::WorkerMessage failed =
      testing::RankExit(name, 1, 0, v1::EXIT_CLASS_RETRYABLE, "cannot prepare");
  failed.mutable_rank_status()->set_prepare_error(
      "mkdir /var/lib/loom/jobs/x: No space left on device (errno 28)");
  failed.mutable_rank_status()->set_no_space(true);
  Send("a", failed);
  const v1::Job job = Get(name);
  EXPECT_EQ(job.state(), v1::SCHEDULED);
  EXPECT_EQ(job.placements(0).node(), "nodes/b");
  EXPECT_EQ(job.restart_count(), 0);
  EXPECT_THAT(NodeNamed("nodes/a").unhealthy_reason(),
              HasSubstr("disk full: mkdir /var/lib/loom/jobs/x: No space left on device"));
  // Nothing new lands on the unhealthy node until its worker registers again.
  const std::string other = Create(CpuSpec(1));
  EXPECT_EQ(Get(other).placements(0).node(), "nodes/b");
  ASSERT_TRUE(Reregister("a", 1));
  EXPECT_EQ(NodeNamed("nodes/a").unhealthy_reason(), "");
}

// A node that failed to prepare a job (no disk-full) is only avoided for that job.
TEST_F(ReliabilityTest, APrepareFailureAvoidsTheNodeForThatJobOnly) {
  auto a = Connect("a", 1);
  const std::string name = Create(CpuSpec(1));
  v1::WorkerMessage failed = testing::RankExit(name, 1, 0, v1::EXIT_CLASS_RETRYABLE);
  failed.mutable_rank_status()->set_prepare_error("write spec.json: Input/output error (errno 5)");
  Send("a", failed);
  EXPECT_EQ(Get(name).state(), v1::RESTARTING);
  Tick(absl::Seconds(1));
  EXPECT_EQ(Get(name).state(), v1::RESTARTING) << "it waits rather than failing on a again";
  EXPECT_EQ(NodeNamed("nodes/a").unhealthy_reason(), "");
  const std::string other = Create(CpuSpec(1));
  EXPECT_EQ(Get(other).state(), v1::SCHEDULED);
}

// ---- Drain, delete, device limits --------------------------------------------------------------

// A stopping worker (SIGTERM) drains its node at once; its gang returns to the queue without
// spending a restart (here it has none) and lands elsewhere after the drain delay.
TEST_F(ReliabilityTest, AStoppingWorkerDrainsAndItsGangIsRequeuedFree) {
  auto a = Connect("a", 1);
  const std::string name = RunningJob("a");
  auto b = Connect("b", 2);
  v1::WorkerMessage draining;
  draining.mutable_draining()->set_reason("stopping on SIGTERM");
  Send("a", draining);
  EXPECT_TRUE(NodeNamed("nodes/a").draining());
  EXPECT_EQ(NodeNamed("nodes/a").drain_reason(), "worker: stopping on SIGTERM");
  v1::Job job = Get(name);
  EXPECT_EQ(job.state(), v1::RESTARTING);
  EXPECT_EQ(job.restart_count(), 0);
  Tick(absl::Seconds(6));
  job = Get(name);
  EXPECT_EQ(job.state(), v1::SCHEDULED);
  EXPECT_EQ(job.placements(0).node(), "nodes/b");
  // Registering again (the worker restarted) ends the worker's own drain.
  ASSERT_TRUE(Reregister("a", 1));
  EXPECT_FALSE(NodeNamed("nodes/a").draining());
}

// The gang moved off a draining node is asked to keep its work (CancelAssignment.checkpoint:
// its ranks save, then exit) and is placed again as soon as every rank has reported its exit,
// not only at the end of the drain delay (the cap, for ranks that never report).
TEST_F(ReliabilityTest, AMovedGangIsAskedToCheckpointAndPlacedOnceItsRanksExited) {
  auto a = Connect("a", 1);
  const std::string name = RunningJob("a");
  auto b = Connect("b", 2);
  a->Take();
  v1::WorkerMessage draining;
  draining.mutable_draining()->set_reason("stopping on SIGTERM");
  Send("a", draining);
  std::vector<v1::CancelAssignment> cancels = Cancels(a->Take());
  ASSERT_EQ(cancels.size(), 1u);
  EXPECT_TRUE(cancels[0].checkpoint()) << "a drain keeps the work";
  Tick(absl::Seconds(1));
  EXPECT_EQ(Get(name).state(), v1::RESTARTING) << "its rank has not exited yet";
  v1::WorkerMessage exited = RankExit(name, 1, 0, v1::EXIT_CLASS_STOPPED, "stopped: exit code 75");
  Send("a", exited);
  v1::Job job = Get(name);
  EXPECT_EQ(job.state(), v1::SCHEDULED) << "placed once every rank exited, 4 s before the cap";
  ASSERT_EQ(job.placements_size(), 1);
  EXPECT_EQ(job.placements(0).node(), "nodes/b");
  EXPECT_EQ(job.restart_count(), 0);

  // A cancel by the user stops at once, without a checkpoint.
  b->Take();
  ASSERT_TRUE(manager_->CancelJob(name).ok());
  cancels = Cancels(b->Take());
  ASSERT_EQ(cancels.size(), 1u);
  EXPECT_FALSE(cancels[0].checkpoint());
}

TEST_F(ReliabilityTest, AnOperatorDrainKeepsNewWorkOffAndSurvivesReRegistration) {
  auto a = Connect("a", 2);
  const std::string running = RunningJob("a");
  v1::DrainNodeRequest drain;
  drain.set_name("nodes/a");
  absl::StatusOr<v1::Node> drained = manager_->DrainNode(drain);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_TRUE(drained->draining());
  EXPECT_EQ(Get(running).state(), v1::RUNNING) << "without move_jobs the gang runs on";
  const std::string queued = Create(CpuSpec(1));
  EXPECT_EQ(Get(queued).state(), v1::QUEUED);
  ASSERT_TRUE(Reregister("a", 2));
  EXPECT_TRUE(NodeNamed("nodes/a").draining()) << "an operator's drain outlives a restart";

  drain.set_move_jobs(true);
  ASSERT_TRUE(manager_->DrainNode(drain).ok());
  EXPECT_EQ(Get(running).state(), v1::RESTARTING);
  EXPECT_EQ(Get(running).restart_count(), 0);

  drain.set_drain(false);
  drain.set_move_jobs(false);
  ASSERT_TRUE(manager_->DrainNode(drain).ok());
  EXPECT_EQ(Get(queued).state(), v1::SCHEDULED);

  drain.set_name("nodes/nope");
  EXPECT_EQ(manager_->DrainNode(drain).status().code(), absl::StatusCode::kNotFound);
  drain.set_name("node-a");
  absl::Status bad = manager_->DrainNode(drain).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("name \"node-a\" must look like nodes/{id}"));
}

TEST_F(ReliabilityTest, DeleteIsRefusedForALiveNodeUnlessForced) {
  auto a = Connect("a", 4);
  auto b = Connect("b", 1);
  const std::string name = RunningJob("b");
  v1::DeleteNodeRequest del;
  del.set_name("nodes/b");
  absl::Status refused = manager_->DeleteNode(del);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("runs 1 gangs"));
  EXPECT_THAT(refused.message(), HasSubstr("--force"));
  del.set_force(true);
  ASSERT_TRUE(manager_->DeleteNode(del).ok());
  EXPECT_EQ(NodeNamed("nodes/b").name(), "");
  EXPECT_TRUE(b->closed());
  EXPECT_EQ(Get(name).restart_count(), 0);
  EXPECT_EQ(Get(name).placements(0).node(), "nodes/a") << "re-queued and placed on a";
  auto stored = store_->ListNodes();
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->size(), 1u) << "removed from the store too";
  EXPECT_EQ(manager_->DeleteNode(del).code(), absl::StatusCode::kNotFound);
}

// The issue: 10 registrations with 200,000 devices each took loomd to 1.3 GB.
TEST_F(ReliabilityTest, RegistrationBeyondTheDeviceLimitIsRefused) {
  options_.device_limits.max_cpu_devices = 16;
  NewManager();
  absl::StatusOr<v1::RegisterNodeResponse> big = manager_->RegisterNode(CpuNode("big", 17));
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.status().message(), HasSubstr("--max-cpu-devices-per-node"));
  EXPECT_TRUE(manager_->ListNodes().nodes().empty()) << "nothing stored";
  EXPECT_TRUE(manager_->RegisterNode(CpuNode("ok", 16)).ok());
}

// ---- Quarantine after a fresh start ------------------------------------------------------------

v1::SessionHello HelloRunning(const std::string& job, int64_t generation) {
  v1::SessionHello hello;
  v1::RunningJob* running = hello.add_running();
  running->set_job(job);
  running->set_generation(generation);
  running->add_ranks(0);
  return hello;
}

// The issue: after loomd started on an empty database, the workers' running gangs were killed.
// With the quarantine (loomd --start-fresh over a state dir that held jobs) they are left
// running, listed and counted until an operator stops them.
TEST_F(ReliabilityTest, UnknownGangsAreQuarantinedNotKilledAfterAFreshStart) {
  metrics::Registry registry;
  server_metrics::ServerMetrics metrics(&registry);
  options_.quarantine_unknown_gangs = true;
  NewManager(&metrics);
  metrics.SetSnapshotSource([this] { return manager_->MetricsSnapshot(); });
  auto sink = Connect("a", 1, HelloRunning("jobs/lost-job", 3));
  EXPECT_TRUE(Cancels(sink->Take()).empty());
  EXPECT_THAT(NodeNamed("nodes/a").quarantined(), ::testing::ElementsAre("jobs/lost-job@3"));
  EXPECT_EQ(manager_->MetricsSnapshot().quarantined_gangs, 1);
  // Only admins are shown the gangs (named by job, of no known tenant).
  const v1::ListNodesResponse for_users = manager_->ListNodes(/*with_quarantined=*/false);
  ASSERT_EQ(for_users.nodes_size(), 1);
  EXPECT_TRUE(for_users.nodes(0).quarantined().empty());
  // Its reports are ignored quietly (no cancel).
  Send("a", Step("jobs/lost-job", 3, 0, 7, 100, 2.0));
  EXPECT_TRUE(Cancels(sink->Take()).empty());

  v1::DrainNodeRequest drain;
  drain.set_name("nodes/a");
  drain.set_drain(false);
  drain.set_stop_quarantined(true);
  ASSERT_TRUE(manager_->DrainNode(drain).ok());
  std::vector<v1::CancelAssignment> cancels = Cancels(sink->Take());
  ASSERT_EQ(cancels.size(), 1u);
  EXPECT_EQ(cancels[0].job(), "jobs/lost-job");
  EXPECT_EQ(cancels[0].generation(), 3);
  EXPECT_TRUE(NodeNamed("nodes/a").quarantined().empty());
}

// A quarantine is the operator's to lift: a later loomd, restarted normally on the same store,
// must not cancel the gang as unknown (it once lived only in the memory of the loomd that
// decided it). It is lifted by itself once the worker no longer runs the gang.
TEST_F(ReliabilityTest, AQuarantineOutlivesARestartOfLoomdUntilTheGangEnds) {
  options_.quarantine_unknown_gangs = true;
  NewManager();
  auto sink = Connect("a", 1, HelloRunning("jobs/lost-job", 3));
  ASSERT_THAT(NodeNamed("nodes/a").quarantined(), ::testing::ElementsAre("jobs/lost-job@3"));

  options_.quarantine_unknown_gangs = false;  // an ordinary restart
  NewManager();
  sessions_.clear();
  sink = Connect("a", 1, HelloRunning("jobs/lost-job", 3));
  EXPECT_TRUE(Cancels(sink->Take()).empty()) << "the quarantined gang was cancelled";
  EXPECT_THAT(NodeNamed("nodes/a").quarantined(), ::testing::ElementsAre("jobs/lost-job@3"));

  // The worker restarted without it: the quarantine is lifted, and stays lifted.
  ASSERT_TRUE(Reregister("a", 1));
  EXPECT_TRUE(NodeNamed("nodes/a").quarantined().empty());
  NewManager();
  sessions_.clear();
  Connect("a", 1);
  EXPECT_TRUE(NodeNamed("nodes/a").quarantined().empty());
}

TEST_F(ReliabilityTest, WithoutAFreshStartUnknownGangsAreStillCancelled) {
  auto sink = Connect("a", 1, HelloRunning("jobs/stale-job", 2));
  EXPECT_EQ(Cancels(sink->Take()).size(), 1u);
  EXPECT_TRUE(NodeNamed("nodes/a").quarantined().empty());
}

}  // namespace
}  // namespace loom::jobs
