// JobManager without a network: MemoryJobStore, FakeClock, and FakeSinks in place of the
// workers' session streams.
#include "server/jobs/job_manager.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/rank_status_batch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/jobs/default_spec_validator.h"
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
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kRendezvous[] = "loomd.test:7070";

// The memory store, recording the state and durability of every UpdateJob (the commit policy
// is the manager's: what may go unsynced).
class RecordingStore : public store::JobStore {
 public:
  struct Update {
    v1::JobState state;
    bool has_event;
    store::Durability durability;
  };
  RecordingStore() : inner_(store::NewMemoryJobStore()) {}
  std::vector<Update> updates() {
    absl::MutexLock lock(&mu_);
    return updates_;
  }
  // Called with each UpdateJob before it is stored (under the manager's lock).
  void OnUpdate(std::function<void(const v1::Job&, store::Durability)> hook) {
    absl::MutexLock lock(&mu_);
    hook_ = std::move(hook);
  }

  absl::StatusOr<int64_t> CreateJob(const v1::Job& job, const v1::JobEvent& first) override {
    return inner_->CreateJob(job, first);
  }
  absl::StatusOr<store::StoredJob> GetJob(std::string_view name) override {
    return inner_->GetJob(name);
  }
  absl::StatusOr<std::optional<store::StoredJob>> FindJobByRequestId(
      std::string_view request_id) override {
    return inner_->FindJobByRequestId(request_id);
  }
  absl::StatusOr<store::JobPage> ListJobs(std::optional<v1::JobState> state, int64_t after,
                                          int limit) override {
    return inner_->ListJobs(state, after, limit);
  }
  // The next UpdateJob that writes `state` fails (as a full or failing disk would), once.
  void FailNextUpdateTo(v1::JobState state) {
    absl::MutexLock lock(&mu_);
    fail_next_ = state;
  }

  using JobStore::UpdateJob;
  absl::Status UpdateJob(const v1::Job& job, const std::optional<v1::JobEvent>& event,
                         store::Durability durability) override {
    std::function<void(const v1::Job&, store::Durability)> hook;
    {
      absl::MutexLock lock(&mu_);
      if (fail_next_ == job.state()) {
        fail_next_.reset();
        return absl::UnavailableError("injected: the store cannot write now");
      }
      updates_.push_back({job.state(), event.has_value(), durability});
      hook = hook_;
    }
    if (hook) hook(job, durability);
    return inner_->UpdateJob(job, event, durability);
  }
  absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(std::string_view name) override {
    return inner_->ListEvents(name);
  }
  absl::StatusOr<std::vector<store::StoredJob>> ListActiveJobs() override {
    return inner_->ListActiveJobs();
  }
  absl::Status PutNode(const v1::Node& node) override { return inner_->PutNode(node); }
  absl::StatusOr<std::vector<v1::Node>> ListNodes() override { return inner_->ListNodes(); }
  absl::Status DeleteNode(std::string_view name) override { return inner_->DeleteNode(name); }

 private:
  const std::unique_ptr<store::JobStore> inner_;
  absl::Mutex mu_;
  std::vector<Update> updates_ ABSL_GUARDED_BY(mu_);
  std::function<void(const v1::Job&, store::Durability)> hook_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::JobState> fail_next_ ABSL_GUARDED_BY(mu_);
};

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto recording = std::make_unique<RecordingStore>();
    recording_ = recording.get();
    store_ = std::move(recording);
    auto logs = LogStore::Open(dir_.File("logs"));
    ASSERT_TRUE(logs.ok()) << logs.status();
    logs_ = std::move(*logs);
    NewManager();
  }

  // (Re)creates the manager on the same store, as a loomd restart would.
  void NewManager() {
    manager_.reset();
    JobManagerOptions options;
    options.rendezvous_address = kRendezvous;
    options.node_timeout = absl::Seconds(10);
    auto manager = JobManager::Create(store_.get(), &clock_, MakeSpecValidator(), logs_.get(),
                                      nullptr, nullptr, options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = std::move(*manager);
  }

  // Recreates the manager exporting to `metrics` (which outlives it), with the default node
  // timeout, and points the metrics' snapshot at it.
  void NewManagerWithMetrics(server_metrics::ServerMetrics* metrics) {
    manager_.reset();
    JobManagerOptions options;
    options.rendezvous_address = kRendezvous;
    auto manager = JobManager::Create(store_.get(), &clock_, MakeSpecValidator(), logs_.get(),
                                      nullptr, metrics, options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = std::move(*manager);
    metrics->SetSnapshotSource([this] { return manager_->MetricsSnapshot(); });
  }

  // Registers a node with `devices` CPU devices and opens its session.
  std::shared_ptr<FakeSink> Connect(const std::string& id, int devices,
                                    const v1::SessionHello& hello_extra = {}) {
    EXPECT_TRUE(manager_->RegisterNode(CpuNode(id, devices)).ok());
    return Reconnect(id, hello_extra);
  }
  // A worker that reconnects: its previous session (if any) ended first, as a restarted
  // worker's stream does; a live session's node id cannot be taken over.
  std::shared_ptr<FakeSink> Reconnect(const std::string& id, v1::SessionHello hello = {}) {
    if (auto it = sessions_.find(id); it != sessions_.end()) manager_->CloseSession(id, it->second);
    auto sink = std::make_shared<FakeSink>();
    hello.set_node_id(id);
    absl::StatusOr<uint64_t> session = manager_->OpenSession(hello, sink);
    EXPECT_TRUE(session.ok()) << session.status();
    sessions_[id] = session.value_or(0);
    return sink;
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
  // Creates a job, which must be placed on a single node at once; returns its name.
  std::string CreateScheduled(const v1::JobSpec& spec, FakeSink& sink) {
    absl::StatusOr<v1::Job> job = manager_->CreateJob(CreateRequest(spec));
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return "";
    EXPECT_EQ(job->state(), v1::SCHEDULED);
    EXPECT_EQ(sink.TakeAssignments().size(), 1u);
    return job->name();
  }
  void StartAll(const std::string& node, const std::string& job, int64_t generation, int ranks) {
    for (int r = 0; r < ranks; ++r)
      Send(node, RankPhase(job, generation, r, v1::RANK_PHASE_RUNNING));
  }
  std::vector<std::string> Reasons(const std::string& name) {
    std::vector<std::string> out;
    const v1::Job job = Get(name);
    for (const v1::JobEvent& e : job.events()) out.push_back(e.reason());
    return out;
  }

  store::testing::TempDir dir_;
  FakeClock clock_;
  std::unique_ptr<store::JobStore> store_;
  RecordingStore* recording_ = nullptr;  // store_
  std::unique_ptr<LogStore> logs_;
  std::unique_ptr<JobManager> manager_;
  std::map<std::string, uint64_t> sessions_;
};

// Only what the workers tell loomd again after a restart is committed unsynced: a gang became
// RUNNING, and its progress. The placement must be durable before the assignment leaves. The
// end is committed unsynced but synced (here by writing it again, as no placement follows)
// before anyone is told.
TEST_F(JobManagerTest, OnlyRunningAndProgressAreCommittedUnsynced) {
  auto sink = Connect("n1", 2);
  const std::string name = CreateScheduled(CpuSpec(2), *sink);
  StartAll("n1", name, 1, 2);
  Send("n1", Step(name, 1, 0, 1, 10, 5.0));
  clock_.Advance(absl::Seconds(5));
  Send("n1", Step(name, 1, 0, 2, 10, 4.0));  // persisted: a second has passed
  Send("n1", RankExit(name, 1, 0, v1::EXIT_CLASS_SUCCESS));
  Send("n1", RankExit(name, 1, 1, v1::EXIT_CLASS_SUCCESS));
  ASSERT_EQ(Get(name).state(), v1::SUCCEEDED);
  std::vector<std::string> seen;
  for (const RecordingStore::Update& u : recording_->updates()) {
    seen.push_back(
        absl::StrCat(v1::JobState_Name(u.state), u.has_event ? "" : " (progress)",
                     u.durability == store::Durability::kSynced ? " synced" : " deferred"));
  }
  EXPECT_THAT(seen,
              ElementsAre("SCHEDULED synced", "RUNNING deferred", "RUNNING (progress) deferred",
                          "SUCCEEDED deferred", "SUCCEEDED (progress) synced"));
}

// Back-to-back gangs: a gang's end and the next gang's placement share one sync (the placement's
// WAL sync takes the end's earlier commit to disk too), and the end reaches its watchers only
// after that sync, and before the placement does.
TEST_F(JobManagerTest, AGangsEndAndTheNextPlacementShareOneSync) {
  auto sink = Connect("n1", 2);
  const std::string first = CreateScheduled(CpuSpec(2), *sink);
  absl::StatusOr<v1::Job> second = manager_->CreateJob(CreateRequest(CpuSpec(2)));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->state(), v1::QUEUED);
  StartAll("n1", first, 1, 2);
  absl::StatusOr<std::shared_ptr<JobSubscription>> first_watch = manager_->WatchJob(first);
  absl::StatusOr<std::shared_ptr<JobSubscription>> second_watch =
      manager_->WatchJob(second->name());
  ASSERT_TRUE(first_watch.ok() && second_watch.ok());
  while ((*first_watch)->TryNext().has_value()) {
  }
  while ((*second_watch)->TryNext().has_value()) {
  }
  const size_t before = recording_->updates().size();

  // What the watchers of the first job had been told when each write reached the store.
  std::vector<std::string> told;
  recording_->OnUpdate([&](const v1::Job& job, store::Durability durability) {
    std::string seen;
    while (std::optional<v1::Job> update = (*first_watch)->TryNext()) {
      absl::StrAppend(&seen, v1::JobState_Name(update->state()));
    }
    told.push_back(absl::StrCat(job.name() == first ? "first " : "second ",
                                v1::JobState_Name(job.state()),
                                durability == store::Durability::kSynced ? " synced" : " deferred",
                                ", first's watchers told: ", seen.empty() ? "nothing" : seen));
  });
  Send("n1", RankExit(first, 1, 0, v1::EXIT_CLASS_SUCCESS));
  Send("n1", RankExit(first, 1, 1, v1::EXIT_CLASS_SUCCESS));
  recording_->OnUpdate(nullptr);

  EXPECT_THAT(told, ElementsAre("first SUCCEEDED deferred, first's watchers told: nothing",
                                "second SCHEDULED synced, first's watchers told: nothing"));
  EXPECT_EQ(recording_->updates().size(), before + 2);  // no third write to sync the end
  std::optional<v1::Job> ended = (*first_watch)->TryNext();
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::SUCCEEDED);
  std::optional<v1::Job> placed = (*second_watch)->TryNext();
  ASSERT_TRUE(placed.has_value());
  EXPECT_EQ(placed->state(), v1::SCHEDULED);
  EXPECT_EQ(Get(first).state(), v1::SUCCEEDED);
  EXPECT_EQ(sink->TakeAssignments().size(), 1u);
}

v1::WorkerMessage Batch(std::initializer_list<v1::WorkerMessage> singles) {
  v1::WorkerMessage batch;
  for (const v1::WorkerMessage& m : singles) {
    *batch.mutable_rank_statuses()->add_statuses() = m.rank_status();
  }
  return batch;
}

// A worker's batch of statuses (a gang's start, its end) does what the statuses sent one by one
// do, with one scheduling pass; RegisterNode tells workers that loomd reads batches; an
// oversized batch is refused whole, naming the field.
TEST_F(JobManagerTest, ABatchOfRankStatusesActsAsTheStatusesSentOneByOne) {
  absl::StatusOr<v1::RegisterNodeResponse> registered = manager_->RegisterNode(CpuNode("n1", 2));
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_TRUE(registered->accepts_rank_status_batches());
  auto sink = Reconnect("n1");
  const std::string first = CreateScheduled(CpuSpec(2), *sink);
  absl::StatusOr<v1::Job> second = manager_->CreateJob(CreateRequest(CpuSpec(2)));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->state(), v1::QUEUED);

  Send("n1", Batch({RankPhase(first, 1, 0, v1::RANK_PHASE_RUNNING),
                    RankPhase(first, 1, 1, v1::RANK_PHASE_RUNNING)}));
  EXPECT_EQ(Get(first).state(), v1::RUNNING);
  const size_t before = recording_->updates().size();
  Send("n1", Batch({RankExit(first, 1, 0, v1::EXIT_CLASS_SUCCESS),
                    RankExit(first, 1, 1, v1::EXIT_CLASS_SUCCESS)}));
  EXPECT_EQ(Get(first).state(), v1::SUCCEEDED);
  EXPECT_EQ(Get(second->name()).state(), v1::SCHEDULED);
  EXPECT_EQ(sink->TakeAssignments().size(), 1u);
  std::vector<std::string> seen;
  for (size_t i = before; i < recording_->updates().size(); ++i) {
    const RecordingStore::Update& u = recording_->updates()[i];
    seen.push_back(
        absl::StrCat(v1::JobState_Name(u.state),
                     u.durability == store::Durability::kSynced ? " synced" : " deferred"));
  }
  EXPECT_THAT(seen, ElementsAre("SUCCEEDED deferred", "SCHEDULED synced"));

  // A start and an end in one message: in order, RUNNING then SUCCEEDED.
  Send("n1", Batch({RankPhase(second->name(), 1, 0, v1::RANK_PHASE_RUNNING),
                    RankPhase(second->name(), 1, 1, v1::RANK_PHASE_RUNNING),
                    RankExit(second->name(), 1, 0, v1::EXIT_CLASS_SUCCESS),
                    RankExit(second->name(), 1, 1, v1::EXIT_CLASS_SUCCESS)}));
  const v1::Job done = Get(second->name());
  EXPECT_EQ(done.state(), v1::SUCCEEDED);
  std::vector<std::string> states;
  for (const v1::JobEvent& e : done.events()) states.push_back(v1::JobState_Name(e.to_state()));
  EXPECT_THAT(states, ElementsAre("QUEUED", "SCHEDULED", "RUNNING", "SUCCEEDED"));

  // Too many statuses: refused whole, before any is applied.
  const std::string third = CreateScheduled(CpuSpec(2), *sink);
  v1::WorkerMessage huge = Batch({RankExit(third, 1, 0, v1::EXIT_CLASS_PERMANENT)});
  for (int i = 0; i < kMaxRankStatusesPerBatch; ++i) {
    *huge.mutable_rank_statuses()->add_statuses() =
        RankPhase(third, 1, 1, v1::RANK_PHASE_RUNNING).rank_status();
  }
  absl::Status refused = manager_->HandleWorkerMessage("n1", sessions_["n1"], huge);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("rank_statuses.statuses"));
  EXPECT_EQ(Get(third).state(), v1::SCHEDULED);
  for (const v1::CoordinatorMessage& m : sink->Take()) EXPECT_FALSE(m.has_cancel());
}

// A queued job waiting behind another tenant's gang is told so without that job's name; behind
// its own tenant's, the name helps and is given.
TEST_F(JobManagerTest, AWaitingReasonNamesNoOtherTenantsJob) {
  auto sink = Connect("n1", 2);
  auto create = [&](int devices, const std::string& tenant) {
    absl::StatusOr<v1::Job> job = manager_->CreateJob(CreateRequest(CpuSpec(devices)), tenant);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.value_or(v1::Job()).name();
  };
  create(2, "team-a");                           // runs, on both devices
  const std::string head = create(2, "team-a");  // waits for devices
  const std::string theirs = create(1, "team-b");
  const std::string ours = create(1, "team-a");
  manager_->Tick();  // a scheduling pass (a create that cannot fit skips it)
  EXPECT_THAT(Get(head).state_reason(), HasSubstr("needs 2 CPU devices"));
  EXPECT_THAT(Get(theirs).state_reason(), HasSubstr("behind another tenant's job (priority 0)"));
  EXPECT_THAT(Get(theirs).state_reason(), Not(HasSubstr(head)));
  EXPECT_THAT(Get(ours).state_reason(), HasSubstr("behind " + head + " (priority 0)"));
}

TEST_F(JobManagerTest, CreateScheduleRunSucceed) {
  auto sink = Connect("n1", 4);
  absl::StatusOr<v1::Job> created = manager_->CreateJob(CreateRequest(CpuSpec(2)));
  ASSERT_TRUE(created.ok()) << created.status();
  const std::string name = created->name();
  EXPECT_TRUE(absl::StartsWith(name, "jobs/"));
  EXPECT_EQ(created->state(), v1::SCHEDULED);
  EXPECT_EQ(created->generation(), 1);
  ASSERT_EQ(created->placements_size(), 1);
  EXPECT_EQ(created->placements(0).node(), "nodes/n1");

  std::vector<v1::Assignment> assigned = sink->TakeAssignments();
  ASSERT_EQ(assigned.size(), 1u);
  const v1::Assignment& a = assigned[0];
  EXPECT_EQ(a.job(), name);
  EXPECT_EQ(a.generation(), 1);
  EXPECT_EQ(a.world_size(), 2);
  EXPECT_EQ(a.num_nodes(), 1);
  EXPECT_EQ(a.node_rank(), 0);
  EXPECT_EQ(a.rendezvous_address(), kRendezvous);
  ASSERT_EQ(a.ranks_size(), 2);
  EXPECT_EQ(a.ranks(1).rank(), 1);
  EXPECT_EQ(a.ranks(1).local_rank(), 1);
  EXPECT_EQ(a.ranks(1).device_kind(), v1::DEVICE_KIND_CPU);
  EXPECT_EQ(a.spec().train().steps(), 10);
  EXPECT_EQ(a.layout().data() * a.layout().tensor() * a.layout().pipeline(), 2);

  Send("n1", RankPhase(name, 1, 0, v1::RANK_PHASE_RUNNING));
  EXPECT_EQ(Get(name).state(), v1::SCHEDULED);  // not every rank yet
  Send("n1", RankPhase(name, 1, 1, v1::RANK_PHASE_RUNNING));
  EXPECT_EQ(Get(name).state(), v1::RUNNING);

  Send("n1", Step(name, 1, 0, 5, 10, 3.5));
  clock_.Advance(absl::Seconds(2));
  Send("n1", Step(name, 1, 0, 6, 10, 3.25));
  v1::Job running = Get(name);
  EXPECT_EQ(running.progress().step(), 6);
  EXPECT_EQ(running.progress().total_steps(), 10);
  EXPECT_DOUBLE_EQ(running.progress().loss(), 3.25);
  EXPECT_NEAR(running.progress().eta_seconds(), 8.0, 1e-6);  // 4 steps at 2 s per step
  EXPECT_EQ(manager_->LatestSteps(name).size(), 1u);

  Send("n1", RankExit(name, 1, 0, v1::EXIT_CLASS_SUCCESS));
  EXPECT_EQ(Get(name).state(), v1::RUNNING);
  Send("n1", RankExit(name, 1, 1, v1::EXIT_CLASS_SUCCESS));
  v1::Job done = Get(name);
  EXPECT_EQ(done.state(), v1::SUCCEEDED);
  EXPECT_EQ(done.placements_size(), 0);
  EXPECT_EQ(done.progress().step(), 6);  // progress is kept with the final state
  std::vector<v1::JobState> states;
  for (const v1::JobEvent& e : done.events()) states.push_back(e.to_state());
  EXPECT_THAT(states,
              ::testing::ElementsAre(v1::QUEUED, v1::SCHEDULED, v1::RUNNING, v1::SUCCEEDED));
  // The devices are free again.
  v1::ListNodesResponse nodes = manager_->ListNodes();
  ASSERT_EQ(nodes.nodes_size(), 1);
  EXPECT_EQ(nodes.nodes(0).allocated_devices_size(), 0);
}

TEST_F(JobManagerTest, JobWaitsForDevicesAndRunsWhenANodeArrives) {
  ASSERT_TRUE(manager_->RegisterNode(CpuNode("n1", 2)).ok());  // registered, no session yet
  absl::StatusOr<v1::Job> job = manager_->CreateJob(CreateRequest(CpuSpec(2)));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::QUEUED);
  auto sink = Reconnect("n1");
  EXPECT_EQ(Get(job->name()).state(), v1::SCHEDULED);
  EXPECT_EQ(sink->TakeAssignments().size(), 1u);
}

TEST_F(JobManagerTest, CancelStopsTheGangAndIsRefusedOnceTerminal) {
  auto sink = Connect("n1", 2);
  const std::string name = CreateScheduled(CpuSpec(2), *sink);
  StartAll("n1", name, 1, 2);
  absl::StatusOr<v1::Job> cancelled = manager_->CancelJob(name);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  std::vector<v1::CoordinatorMessage> sent = sink->Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].cancel().job(), name);
  EXPECT_EQ(sent[0].cancel().generation(), 1);

  absl::StatusOr<v1::Job> again = manager_->CancelJob(name);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("already CANCELLED"));
  // The devices went back to the pool: a new job is placed at once.
  CreateScheduled(CpuSpec(2), *sink);
}

TEST_F(JobManagerTest, RetryableFailureRestartsWithBackoffUntilExhausted) {
  auto sink = Connect("n1", 2);
  const std::string name = CreateScheduled(CpuSpec(2, /*max_restarts=*/2, 1.0), *sink);
  StartAll("n1", name, 1, 2);

  Send("n1", RankExit(name, 1, 1, v1::EXIT_CLASS_RETRYABLE, "killed by signal 9 (SIGKILL)"));
  v1::Job job = Get(name);
  EXPECT_EQ(job.state(), v1::RESTARTING);
  EXPECT_EQ(job.restart_count(), 1);
  EXPECT_THAT(job.state_reason(), HasSubstr("rank 1 killed by signal 9 (SIGKILL)"));
  std::vector<v1::CoordinatorMessage> sent = sink->Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_TRUE(sent[0].has_cancel());

  // Backoff 1 s: nothing before it, a new generation after it.
  clock_.Advance(absl::Milliseconds(900));
  manager_->Tick();
  EXPECT_EQ(Get(name).state(), v1::RESTARTING);
  clock_.Advance(absl::Milliseconds(200));
  manager_->Tick();
  job = Get(name);
  EXPECT_EQ(job.state(), v1::SCHEDULED);
  EXPECT_EQ(job.generation(), 2);
  std::vector<v1::Assignment> assigned = sink->TakeAssignments();
  ASSERT_EQ(assigned.size(), 1u);
  EXPECT_EQ(assigned[0].generation(), 2);

  // Second failure: backoff doubles to 2 s.
  StartAll("n1", name, 2, 2);
  Send("n1", RankExit(name, 2, 0, v1::EXIT_CLASS_RETRYABLE, "killed by signal 9 (SIGKILL)"));
  EXPECT_EQ(Get(name).state(), v1::RESTARTING);
  clock_.Advance(absl::Milliseconds(1500));
  manager_->Tick();
  EXPECT_EQ(Get(name).state(), v1::RESTARTING);
  clock_.Advance(absl::Milliseconds(600));
  manager_->Tick();
  EXPECT_EQ(Get(name).generation(), 3);
  sink->Take();

  // Third failure: restarts exhausted.
  Send("n1", RankExit(name, 3, 1, v1::EXIT_CLASS_RETRYABLE, "killed by signal 9 (SIGKILL)"));
  job = Get(name);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_EQ(job.state_reason(), "rank 1 killed by signal 9 (SIGKILL); restarts exhausted (2 of 2)");
  EXPECT_THAT(
      Reasons(name),
      ::testing::Contains("rank 1 killed by signal 9 (SIGKILL); restarts exhausted (2 of 2)"));
}

TEST_F(JobManagerTest, PermanentFailureFailsWithoutRestart) {
  auto sink = Connect("n1", 2);
  const std::string name = CreateScheduled(CpuSpec(2, /*max_restarts=*/3), *sink);
  StartAll("n1", name, 1, 2);
  Send("n1", RankExit(name, 1, 0, v1::EXIT_CLASS_PERMANENT, "exit code 2: unknown preset"));
  v1::Job job = Get(name);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_EQ(job.restart_count(), 0);
  EXPECT_EQ(job.state_reason(), "rank 0 exit code 2: unknown preset");
}

TEST_F(JobManagerTest, StaleGenerationReportsAreIgnoredAndCancelled) {
  auto sink = Connect("n1", 2);
  const std::string name = CreateScheduled(CpuSpec(2, /*max_restarts=*/3, 0.0), *sink);
  StartAll("n1", name, 1, 2);
  Send("n1", RankExit(name, 1, 0, v1::EXIT_CLASS_RETRYABLE, "killed by signal 9 (SIGKILL)"));
  manager_->Tick();  // zero backoff: generation 2 at once
  ASSERT_EQ(Get(name).generation(), 2);
  sink->Take();

  // A late failure of generation 1 changes nothing.
  Send("n1", RankExit(name, 1, 1, v1::EXIT_CLASS_RETRYABLE, "killed by signal 15"));
  EXPECT_EQ(Get(name).state(), v1::SCHEDULED);
  EXPECT_TRUE(sink->Take().empty());  // an exit needs no cancel
  // A generation-1 rank that still runs is told to stop (once).
  Send("n1", Step(name, 1, 0, 3, 10, 4.0));
  Send("n1", Step(name, 1, 0, 4, 10, 4.0));
  std::vector<v1::CoordinatorMessage> sent = sink->Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].cancel().generation(), 1);
  EXPECT_EQ(Get(name).progress().step(), 0);
}

TEST_F(JobManagerTest, LostNodeFailsItsJobsOver) {
  auto sink1 = Connect("n1", 2);
  const std::string name = CreateScheduled(CpuSpec(2, /*max_restarts=*/1, 1.0), *sink1);
  StartAll("n1", name, 1, 2);
  auto sink2 = Connect("n2", 2);

  // n2 keeps heartbeating, n1 goes silent.
  for (int i = 0; i < 11; ++i) {
    clock_.Advance(absl::Seconds(1));
    Send("n2", ::loom::testing::Heartbeat());
    manager_->Tick();
  }
  v1::ListNodesResponse nodes = manager_->ListNodes();
  ASSERT_EQ(nodes.nodes_size(), 2);
  EXPECT_EQ(nodes.nodes(0).state(), v1::NODE_STATE_LOST);
  EXPECT_EQ(nodes.nodes(1).state(), v1::NODE_STATE_READY);
  EXPECT_TRUE(sink1->closed());
  // Failed over (after its 1 s backoff the gang is placed again, on n2).
  v1::Job job = Get(name);
  EXPECT_THAT(Reasons(name), ::testing::Contains(HasSubstr("node nodes/n1 was lost")));
  EXPECT_EQ(job.restart_count(), 1);
  if (job.state() == v1::RESTARTING) {
    clock_.Advance(absl::Seconds(1));
    manager_->Tick();
    job = Get(name);
  }
  EXPECT_EQ(job.state(), v1::SCHEDULED);
  EXPECT_EQ(job.generation(), 2);
  EXPECT_EQ(job.placements(0).node(), "nodes/n2");
  EXPECT_EQ(sink2->TakeAssignments().size(), 1u);
  // A message on the dead session is refused.
  EXPECT_EQ(
      manager_->HandleWorkerMessage("n1", sessions_["n1"], ::loom::testing::Heartbeat()).code(),
      absl::StatusCode::kFailedPrecondition);
}

// A tick runs a scheduling pass only when one can place a job or something changed since the
// last; the waiting reasons still follow every change. Here the change is a node lost with no
// gang on it (no job changes state), and the queued job's reason counts the ready nodes again.
TEST_F(JobManagerTest, AWaitingReasonFollowsALostNodeWithNoGangOnIt) {
  auto sink1 = Connect("n1", 2);
  const std::string running = CreateScheduled(CpuSpec(2), *sink1);
  StartAll("n1", running, 1, 2);
  auto sink2 = Connect("n2", 2);
  absl::StatusOr<v1::Job> waiting = manager_->CreateJob(CreateRequest(CpuSpec(4)));
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  ASSERT_EQ(waiting->state(), v1::QUEUED);
  manager_->Tick();  // the create skipped the pass (4 > 2 free): the tick writes the reason
  EXPECT_THAT(Get(waiting->name()).state_reason(),
              HasSubstr("needs 4 CPU devices; 2 free on 2 ready nodes"));

  for (int i = 0; i < 11; ++i) {  // n1 keeps heartbeating, n2 goes silent
    clock_.Advance(absl::Seconds(1));
    Send("n1", ::loom::testing::Heartbeat());
    manager_->Tick();
  }
  ASSERT_EQ(manager_->ListNodes().nodes(1).state(), v1::NODE_STATE_LOST);
  EXPECT_EQ(Get(running).state(), v1::RUNNING);
  EXPECT_THAT(Get(waiting->name()).state_reason(),
              HasSubstr("the 1 ready CPU node hold 2 devices in all"));
}

// At rest (nothing changes, nothing can be placed) the tick leaves the queue alone, and the
// next change still places the head of the queue at once: the ticks that skipped their pass
// lost nothing.
TEST_F(JobManagerTest, TicksAtRestPlaceNothingAndTheNextEndPlacesTheHead) {
  auto sink = Connect("n1", 2);
  const std::string running = CreateScheduled(CpuSpec(2), *sink);
  StartAll("n1", running, 1, 2);
  std::vector<std::string> queued;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<v1::Job> job = manager_->CreateJob(CreateRequest(CpuSpec(2)));
    ASSERT_TRUE(job.ok()) << job.status();
    queued.push_back(job->name());
  }
  const size_t writes = recording_->updates().size();
  for (int i = 0; i < 20; ++i) {
    clock_.Advance(absl::Milliseconds(100));
    Send("n1", ::loom::testing::Heartbeat());
    manager_->Tick();
  }
  EXPECT_EQ(recording_->updates().size(), writes);
  EXPECT_TRUE(sink->TakeAssignments().empty());
  for (const std::string& name : queued) EXPECT_EQ(Get(name).state(), v1::QUEUED);
  EXPECT_THAT(Get(queued[1]).state_reason(), HasSubstr("behind " + queued[0]));

  Send("n1", RankExit(running, 1, 0, v1::EXIT_CLASS_SUCCESS));
  Send("n1", RankExit(running, 1, 1, v1::EXIT_CLASS_SUCCESS));
  EXPECT_EQ(Get(queued[0]).state(), v1::SCHEDULED);
  EXPECT_EQ(sink->TakeAssignments().size(), 1u);
  EXPECT_THAT(Get(queued[2]).state_reason(), HasSubstr("behind " + queued[1]));
}

// A placement the store refused is tried again by the next tick (the tick runs a pass only
// when one could decide something new, and a failed launch is such a thing).
TEST_F(JobManagerTest, APlacementTheStoreRefusedIsRetriedByTheNextTick) {
  auto sink = Connect("n1", 2);
  const std::string first = CreateScheduled(CpuSpec(2), *sink);
  StartAll("n1", first, 1, 2);
  absl::StatusOr<v1::Job> second = manager_->CreateJob(CreateRequest(CpuSpec(2)));
  ASSERT_TRUE(second.ok()) << second.status();
  recording_->FailNextUpdateTo(v1::SCHEDULED);
  Send("n1", RankExit(first, 1, 0, v1::EXIT_CLASS_SUCCESS));
  Send("n1", RankExit(first, 1, 1, v1::EXIT_CLASS_SUCCESS));
  EXPECT_EQ(Get(first).state(), v1::SUCCEEDED);
  EXPECT_EQ(Get(second->name()).state(), v1::QUEUED);
  EXPECT_TRUE(sink->TakeAssignments().empty());

  clock_.Advance(absl::Milliseconds(100));
  Send("n1", ::loom::testing::Heartbeat());
  manager_->Tick();
  EXPECT_EQ(Get(second->name()).state(), v1::SCHEDULED);
  EXPECT_EQ(sink->TakeAssignments().size(), 1u);
}

TEST_F(JobManagerTest, RestartKeepsRunningJobsAndReconcilesOnHello) {
  auto sink = Connect("n1", 4);
  const std::string name = CreateScheduled(CpuSpec(2), *sink);
  StartAll("n1", name, 1, 2);

  NewManager();  // loomd restarted on the same store
  EXPECT_EQ(Get(name).state(), v1::RUNNING);
  v1::SessionHello hello;
  v1::RunningJob* running = hello.add_running();
  running->set_job(name);
  running->set_generation(1);
  running->add_ranks(0);
  running->add_ranks(1);
  v1::RunningJob* unknown = hello.add_running();
  unknown->set_job("jobs/unknown-job");
  unknown->set_generation(4);
  auto sink2 = Reconnect("n1", hello);

  std::vector<v1::CoordinatorMessage> sent = sink2->Take();
  ASSERT_EQ(sent.size(), 1u);  // no assignment: nothing is launched twice
  EXPECT_EQ(sent[0].cancel().job(), "jobs/unknown-job");
  EXPECT_EQ(sent[0].cancel().generation(), 4);
  v1::Job job = Get(name);
  EXPECT_EQ(job.state(), v1::RUNNING);
  EXPECT_EQ(job.generation(), 1);
  // Its devices stay allocated: a second 4-device job cannot be placed now.
  absl::StatusOr<v1::Job> other = manager_->CreateJob(CreateRequest(CpuSpec(4)));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->state(), v1::QUEUED);
  // And it completes normally.
  Send("n1", RankExit(name, 1, 0, v1::EXIT_CLASS_SUCCESS));
  Send("n1", RankExit(name, 1, 1, v1::EXIT_CLASS_SUCCESS));
  EXPECT_EQ(Get(name).state(), v1::SUCCEEDED);
  EXPECT_EQ(Get(other->name()).state(), v1::SCHEDULED);
}

TEST_F(JobManagerTest, AGangMissingFromHelloFailsOver) {
  auto sink = Connect("n1", 2);
  const std::string name = CreateScheduled(CpuSpec(2, /*max_restarts=*/1), *sink);
  StartAll("n1", name, 1, 2);
  Reconnect("n1");                            // the worker restarted and lost its ranks
  EXPECT_EQ(Get(name).state(), v1::RUNNING);  // it gets the reconcile grace first
  clock_.Advance(absl::Seconds(2));
  manager_->Tick();
  EXPECT_EQ(Get(name).state(), v1::RUNNING);
  clock_.Advance(absl::Seconds(2));
  manager_->Tick();
  v1::Job job = Get(name);
  EXPECT_EQ(job.state(), v1::RESTARTING);
  EXPECT_THAT(job.state_reason(), HasSubstr("reconnected without the ranks of generation 1"));
}

TEST_F(JobManagerTest, AGangThatFinishedWhileLoomdWasAwayIsNotRestarted) {
  auto sink = Connect("n1", 2);
  const std::string name = CreateScheduled(CpuSpec(2, /*max_restarts=*/1), *sink);
  StartAll("n1", name, 1, 2);
  NewManager();
  Reconnect("n1");  // nothing runs any more: the ranks finished while loomd was down
  // The worker re-sends the exit reports loomd may have missed.
  Send("n1", RankExit(name, 1, 0, v1::EXIT_CLASS_SUCCESS));
  Send("n1", RankExit(name, 1, 1, v1::EXIT_CLASS_SUCCESS));
  clock_.Advance(absl::Seconds(4));
  manager_->Tick();
  v1::Job job = Get(name);
  EXPECT_EQ(job.state(), v1::SUCCEEDED);
  EXPECT_EQ(job.generation(), 1);
}

TEST_F(JobManagerTest, KnownNodeThatDoesNotReconnectAfterRestartIsLost) {
  auto sink = Connect("n1", 2);
  const std::string name = CreateScheduled(CpuSpec(2), *sink);
  StartAll("n1", name, 1, 2);
  NewManager();
  clock_.Advance(absl::Seconds(5));
  manager_->Tick();
  EXPECT_EQ(Get(name).state(), v1::RUNNING);
  clock_.Advance(absl::Seconds(6));
  manager_->Tick();
  EXPECT_EQ(manager_->ListNodes().nodes(0).state(), v1::NODE_STATE_LOST);
  v1::Job job = Get(name);
  EXPECT_EQ(job.state(), v1::FAILED);  // max_restarts 0
  EXPECT_THAT(job.state_reason(), HasSubstr("restarts exhausted (0 of 0)"));
}

TEST_F(JobManagerTest, CreateJobIsIdempotentByRequestId) {
  Connect("n1", 2);
  absl::StatusOr<v1::Job> first = manager_->CreateJob(CreateRequest(CpuSpec(2), "req-1"));
  absl::StatusOr<v1::Job> second = manager_->CreateJob(CreateRequest(CpuSpec(2), "req-1"));
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->name(), second->name());
  EXPECT_EQ(second->request_id(), "req-1");
  absl::StatusOr<v1::ListJobsResponse> all = manager_->ListJobs({});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->jobs_size(), 1);
}

TEST_F(JobManagerTest, RequestIdsAndListsArePerTenant) {
  ASSERT_TRUE(manager_->RegisterNode(CpuNode("n1", 2)).ok());  // capacity, no session
  absl::StatusOr<v1::Job> a = manager_->CreateJob(CreateRequest(CpuSpec(2), "req-1"), "team-a");
  absl::StatusOr<v1::Job> b = manager_->CreateJob(CreateRequest(CpuSpec(2), "req-1"), "team-b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->name(), b->name());  // never another tenant's job for the same key
  EXPECT_EQ(a->tenant(), "team-a");
  absl::StatusOr<v1::Job> a_again =
      manager_->CreateJob(CreateRequest(CpuSpec(2), "req-1"), "team-a");
  ASSERT_TRUE(a_again.ok());
  EXPECT_EQ(a_again->name(), a->name());
  // Pages of one tenant are full and skip the other tenant's jobs.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(manager_->CreateJob(CreateRequest(CpuSpec(2)), "team-b").ok());
  }
  ASSERT_TRUE(manager_->CreateJob(CreateRequest(CpuSpec(2)), "team-a").ok());
  v1::ListJobsRequest request;
  request.set_page_size(1);
  std::vector<std::string> seen;
  while (true) {
    absl::StatusOr<v1::ListJobsResponse> page =
        manager_->ListJobs(request, std::optional<std::string>("team-a"));
    ASSERT_TRUE(page.ok()) << page.status();
    for (const v1::Job& job : page->jobs()) {
      EXPECT_EQ(job.tenant(), "team-a");
      seen.push_back(job.name());
    }
    if (page->next_page_token().empty()) break;
    EXPECT_EQ(page->jobs_size(), 1);
    request.set_page_token(page->next_page_token());
  }
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_EQ(manager_->ListJobs({})->jobs_size(), 6);  // no tenant: every job (admins)
}

TEST_F(JobManagerTest, ALiveNodeIdCannotBeRegisteredOrSessionedTwice) {
  Connect("n1", 2);
  absl::Status second = manager_->RegisterNode(CpuNode("n1", 4)).status();
  EXPECT_TRUE(absl::IsAlreadyExists(second)) << second;
  v1::SessionHello hello;
  hello.set_node_id("n1");
  absl::Status session = manager_->OpenSession(hello, std::make_shared<FakeSink>()).status();
  EXPECT_TRUE(absl::IsAlreadyExists(session)) << session;
  // The first session is untouched and still current.
  Send("n1", ::loom::testing::Heartbeat());
  // A node silent past the node timeout is presumed gone: its id may be registered again.
  clock_.Advance(absl::Seconds(11));
  EXPECT_TRUE(manager_->RegisterNode(CpuNode("n1", 4)).ok());
}

TEST_F(JobManagerTest, ListJobsPagesWithOpaqueTokens) {
  ASSERT_TRUE(manager_->RegisterNode(CpuNode("n1", 2)).ok());  // capacity, no session
  std::vector<std::string> names;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<v1::Job> job = manager_->CreateJob(CreateRequest(CpuSpec(2)));
    ASSERT_TRUE(job.ok()) << job.status();
    names.push_back(job->name());
  }
  ASSERT_TRUE(manager_->CancelJob(names[1]).ok());
  std::vector<std::string> seen;
  v1::ListJobsRequest request;
  request.set_page_size(2);
  int pages = 0;
  while (true) {
    absl::StatusOr<v1::ListJobsResponse> page = manager_->ListJobs(request);
    ASSERT_TRUE(page.ok()) << page.status();
    ++pages;
    for (const v1::Job& j : page->jobs()) seen.push_back(j.name());
    if (page->next_page_token().empty()) break;
    request.set_page_token(page->next_page_token());
  }
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen, names);

  v1::ListJobsRequest queued;
  queued.set_state(v1::QUEUED);
  absl::StatusOr<v1::ListJobsResponse> only = manager_->ListJobs(queued);
  ASSERT_TRUE(only.ok());
  EXPECT_EQ(only->jobs_size(), 4);

  v1::ListJobsRequest bad;
  bad.set_page_token("not-a-token");
  EXPECT_EQ(manager_->ListJobs(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(manager_->ListJobs(bad).status().message()), HasSubstr("page_token"));
  bad.set_page_token("");
  bad.set_page_size(-1);
  EXPECT_THAT(std::string(manager_->ListJobs(bad).status().message()), HasSubstr("page_size"));
}

TEST_F(JobManagerTest, MalformedRequestsWriteNothing) {
  Connect("n1", 2);
  EXPECT_THAT(std::string(manager_->GetJob("foo").status().message()),
              HasSubstr("name must look like jobs/{job}"));
  EXPECT_EQ(manager_->GetJob("jobs/Bad_Id").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manager_->GetJob("jobs/missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->CancelJob("jobs/missing").status().code(), absl::StatusCode::kNotFound);

  v1::CreateJobRequest no_spec;
  EXPECT_EQ(manager_->CreateJob(no_spec).status().code(), absl::StatusCode::kInvalidArgument);
  v1::JobSpec too_big = CpuSpec(64);
  absl::Status status = manager_->CreateJob(CreateRequest(too_big)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  v1::JobSpec bad_preset = CpuSpec(2);
  bad_preset.mutable_model()->set_preset("gpt5");
  status = manager_->CreateJob(CreateRequest(bad_preset)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("preset"));
  EXPECT_EQ(manager_->ListJobs({})->jobs_size(), 0);

  v1::RegisterNodeRequest bad_node = CpuNode("Bad Node", 1);
  EXPECT_THAT(std::string(manager_->RegisterNode(bad_node).status().message()),
              HasSubstr("node_id"));
  v1::RegisterNodeRequest no_devices = CpuNode("n2", 0);
  EXPECT_THAT(std::string(manager_->RegisterNode(no_devices).status().message()),
              HasSubstr("devices"));
  v1::SessionHello stranger;
  stranger.set_node_id("never-registered");
  EXPECT_EQ(manager_->OpenSession(stranger, std::make_shared<FakeSink>()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->ListNodes().nodes_size(), 1);
  // Garbage on a session is refused without harm.
  v1::WorkerMessage empty;
  EXPECT_EQ(manager_->HandleWorkerMessage("n1", sessions_["n1"], empty).code(),
            absl::StatusCode::kInvalidArgument);
  Send("n1", RankExit("not a job", -5, 99, v1::EXIT_CLASS_RETRYABLE));
  Send("n1", Step("jobs/ghost", 7, 0, 1, 1, 1.0));
}

TEST_F(JobManagerTest, WatchSeesTheCurrentJobThenEveryChange) {
  auto sink = Connect("n1", 2);
  const std::string name = CreateScheduled(CpuSpec(2), *sink);
  absl::StatusOr<std::shared_ptr<JobSubscription>> watch = manager_->WatchJob(name);
  ASSERT_TRUE(watch.ok()) << watch.status();
  std::optional<v1::Job> first = (*watch)->Next(absl::ZeroDuration());
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->state(), v1::SCHEDULED);
  StartAll("n1", name, 1, 2);
  Send("n1", Step(name, 1, 0, 1, 10, 5.0));
  Send("n1", Step(name, 1, 0, 2, 10, 4.0));  // coalesced with the previous one
  ASSERT_TRUE(manager_->CancelJob(name).ok());
  std::vector<v1::Job> updates;
  while (auto next = (*watch)->Next(absl::ZeroDuration())) updates.push_back(*next);
  ASSERT_EQ(updates.size(), 3u);
  EXPECT_EQ(updates[0].state(), v1::RUNNING);
  EXPECT_EQ(updates[1].progress().step(), 2);
  EXPECT_EQ(updates[2].state(), v1::CANCELLED);
  EXPECT_TRUE((*watch)->closed());
}

TEST_F(JobManagerTest, LogsAreStoredPerJob) {
  auto sink = Connect("n1", 2);
  const std::string name = CreateScheduled(CpuSpec(2), *sink);
  v1::WorkerMessage logs;
  logs.mutable_logs()->set_job(name);
  logs.mutable_logs()->set_generation(1);
  logs.mutable_logs()->set_rank(1);
  logs.mutable_logs()->set_stream("stderr");
  logs.mutable_logs()->add_lines("hello from rank 1");
  logs.mutable_logs()->add_lines("second\tline");
  Send("n1", logs);
  absl::StatusOr<LogBatch> batch = logs_->Read(name.substr(5), 0, 1);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->lines.size(), 2u);
  EXPECT_EQ(batch->lines[0].text(), "hello from rank 1");
  EXPECT_EQ(batch->lines[1].text(), "second line");
  EXPECT_EQ(batch->lines[0].stream(), "stderr");
  EXPECT_EQ(batch->lines[0].node(), "nodes/n1");
  EXPECT_TRUE(logs_->Read(name.substr(5), 0, 0)->lines.empty());
}

// A node writes log lines only into the gangs it runs (or just ran): another node cannot fill a
// job's log (and use up its quota) nor write lines under loomd's own rank -1.
TEST_F(JobManagerTest, LogsAreTakenOnlyFromTheNodesOfTheGang) {
  auto sink = Connect("n1", 2);
  auto other = Connect("n2", 2);
  const std::string name = CreateScheduled(CpuSpec(2), *sink);
  auto chunk = [&](int64_t generation, int rank, const std::string& text) {
    v1::WorkerMessage m;
    m.mutable_logs()->set_job(name);
    m.mutable_logs()->set_generation(generation);
    m.mutable_logs()->set_rank(rank);
    m.mutable_logs()->add_lines(text);
    return m;
  };
  auto texts = [&] {
    std::vector<std::string> out;
    absl::StatusOr<LogBatch> batch = logs_->Read(name.substr(5), 0, std::nullopt);
    EXPECT_TRUE(batch.ok()) << batch.status();
    for (const v1::LogLine& line : batch.value_or(LogBatch()).lines) out.push_back(line.text());
    return out;
  };
  Send("n1", chunk(1, 0, "from the gang"));
  Send("n2", chunk(1, 0, "from another node"));
  Send("n1", chunk(1, -1, "posing as loomd"));
  Send("n1", chunk(2, 0, "a generation that never ran"));
  Send("n1", chunk(1, 7, "a rank the job does not have"));
  EXPECT_THAT(texts(), ElementsAre("from the gang"));
  // The gang ends; its worker still flushes its last lines, and only its worker.
  StartAll("n1", name, 1, 2);
  Send("n1", RankExit(name, 1, 0, v1::EXIT_CLASS_SUCCESS));
  Send("n1", RankExit(name, 1, 1, v1::EXIT_CLASS_SUCCESS));
  ASSERT_EQ(Get(name).state(), v1::SUCCEEDED);
  Send("n1", chunk(1, 1, "last line"));
  Send("n2", chunk(1, 1, "late from another node"));
  EXPECT_THAT(texts(), ElementsAre("from the gang", "last line"));
}

TEST_F(JobManagerTest, ProgressIsWrittenToTheStoreAtMostAboutOncePerSecond) {
  auto sink = Connect("n1", 2);
  const std::string name = CreateScheduled(CpuSpec(2), *sink);
  StartAll("n1", name, 1, 2);
  clock_.Advance(absl::Seconds(2));
  Send("n1", Step(name, 1, 0, 1, 10, 5.0));  // first report after a quiet second: written
  for (int step = 2; step <= 5; ++step) {
    clock_.Advance(absl::Milliseconds(100));
    Send("n1", Step(name, 1, 0, step, 10, 5.0 - step * 0.1));
  }
  EXPECT_EQ(store_->GetJob(name)->job.progress().step(), 1);  // not hammered
  EXPECT_EQ(Get(name).progress().step(), 5);                  // but served fresh
  clock_.Advance(absl::Seconds(1));
  manager_->Tick();  // the throttled write catches up
  EXPECT_EQ(store_->GetJob(name)->job.progress().step(), 5);
}

TEST_F(JobManagerTest, MetricsFollowJobsNodesAndRestarts) {
  metrics::Registry registry;
  server_metrics::ServerMetrics metrics(&registry);
  NewManagerWithMetrics(&metrics);

  auto sink = Connect("n1", 2);
  const std::string name = CreateScheduled(CpuSpec(2, /*max_restarts=*/1), *sink);
  ASSERT_TRUE(manager_->CreateJob(CreateRequest(CpuSpec(2))).ok());  // waits: no devices
  Send("n1", RankExit(name, 1, 0, v1::EXIT_CLASS_RETRYABLE, "killed by signal 9 (SIGKILL)"));
  const std::string text = registry.Serialize();
  EXPECT_THAT(text, HasSubstr("loom_job_restarts_total 1"));
  EXPECT_THAT(text, HasSubstr("loom_jobs{state=\"RESTARTING\"} 1"));
  EXPECT_THAT(text, HasSubstr("loom_scheduler_queue_depth 0"));  // the second job got n1
  EXPECT_THAT(text, HasSubstr("loom_jobs{state=\"SCHEDULED\"} 1"));
  EXPECT_THAT(text, HasSubstr("loom_nodes{state=\"READY\"} 1"));
  EXPECT_THAT(text, HasSubstr("loom_devices{kind=\"cpu\",state=\"allocated\"} 2"));
  EXPECT_THAT(text, HasSubstr("loom_scheduling_latency_seconds_count 2"));
}

// The ranks of each placement, in order, by node name.
std::map<std::string, std::vector<int>> RanksByNode(const v1::Job& job) {
  std::map<std::string, std::vector<int>> out;
  for (const v1::Placement& p : job.placements()) {
    out[p.node()].assign(p.ranks().begin(), p.ranks().end());
  }
  return out;
}

// The scheduler gets the layout's tensor size, so each tensor group stays on one node: 4 ranks
// in groups of 2 over two nodes of 3 devices go 2 + 2 (plain packing would put 3 + 1 and split
// the group {2, 3}); also after a loomd restart, for a job restored from the store.
TEST_F(JobManagerTest, TensorGroupsStayInsideANode) {
  v1::JobSpec spec = CpuSpec(4);
  spec.mutable_parallelism()->set_data(2);
  spec.mutable_parallelism()->set_tensor(2);
  // Sharded checkpoints from two nodes need a shared dir (else loomd keeps the job on one node).
  spec.mutable_checkpoint()->set_dir("/shared/ckpt");
  ASSERT_TRUE(manager_->RegisterNode(CpuNode("n1", 3)).ok());
  ASSERT_TRUE(manager_->RegisterNode(CpuNode("n2", 3)).ok());
  absl::StatusOr<v1::Job> queued = manager_->CreateJob(CreateRequest(spec));
  ASSERT_TRUE(queued.ok()) << queued.status();
  EXPECT_EQ(queued->layout().tensor(), 2);
  EXPECT_EQ(queued->state(), v1::QUEUED);  // no sessions yet
  NewManager();                            // the tensor size comes back from the store
  auto sink1 = Reconnect("n1");
  auto sink2 = Reconnect("n2");
  const v1::Job job = Get(queued->name());
  ASSERT_EQ(job.state(), v1::SCHEDULED);
  EXPECT_THAT(RanksByNode(job),
              ::testing::ElementsAre(::testing::Pair("nodes/n1", ::testing::ElementsAre(0, 1)),
                                     ::testing::Pair("nodes/n2", ::testing::ElementsAre(2, 3))));
  std::vector<v1::Assignment> assigned = sink1->TakeAssignments();
  ASSERT_EQ(assigned.size(), 1u);
  EXPECT_EQ(assigned[0].layout().tensor(), 2);
  EXPECT_EQ(assigned[0].world_size(), 4);
}

// One tensor group of 2, and one free device on each of two nodes (n1 has 2, one of them busy):
// the job waits (saying why) rather than being split over the nodes, as plain packing would do.
TEST_F(JobManagerTest, ATensorGroupWaitsRatherThanBeingSplitAcrossNodes) {
  auto sink1 = Connect("n1", 2);
  CreateScheduled(CpuSpec(1), *sink1);  // takes one device of n1
  auto sink2 = Connect("n2", 1);
  v1::JobSpec spec = CpuSpec(2);
  spec.mutable_parallelism()->set_tensor(2);
  absl::StatusOr<v1::Job> job = manager_->CreateJob(CreateRequest(spec));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->layout().data(), 1);
  EXPECT_EQ(job->state(), v1::QUEUED);
  EXPECT_THAT(job->state_reason(), HasSubstr("tensor groups of 2"));
  EXPECT_TRUE(sink1->TakeAssignments().empty());
  EXPECT_TRUE(sink2->TakeAssignments().empty());
}

// A training step report of rank 0 with the given step time and forward/backward split.
v1::WorkerMessage TimedStep(const std::string& job, int64_t step, double seconds) {
  v1::WorkerMessage m = Step(job, 1, 0, step, 100, 3.0);
  m.mutable_step()->set_step_seconds(seconds);
  (*m.mutable_step()->mutable_phase_seconds())["forward"] = seconds * 0.25;
  (*m.mutable_step()->mutable_phase_seconds())["backward"] = seconds * 0.5;
  (*m.mutable_step()->mutable_phase_seconds())["data"] = 0.01;
  return m;
}

// Predicted vs measured: rank 0's step times (warmup excluded, median of the rest) are kept
// beside the plan in GetJob, persisted with the throttled progress writes, and exported as
// gauges that disappear when the job ends.
TEST_F(JobManagerTest, MeasuredStepTimeIsKeptBesideThePrediction) {
  metrics::Registry registry;
  server_metrics::ServerMetrics metrics(&registry);
  NewManagerWithMetrics(&metrics);

  auto sink = Connect("n1", 2);
  const std::string name = CreateScheduled(CpuSpec(2), *sink);  // `auto`: planned
  const std::string id = name.substr(5);
  StartAll("n1", name, 1, 2);
  const v1::Job planned = Get(name);
  ASSERT_TRUE(planned.has_plan()) << planned.events(0).reason();
  const double predicted = planned.plan().step_seconds();
  ASSERT_GT(predicted, 0);
  EXPECT_FALSE(planned.has_plan_check());
  std::string text = registry.Serialize();
  EXPECT_THAT(text, HasSubstr(absl::StrCat("loom_job_predicted_step_seconds{job=\"", id, "\"}")));
  EXPECT_THAT(text, Not(HasSubstr("loom_job_step_seconds{")));  // nothing measured yet

  // Two warmup steps (slow, ignored), then 0.4, 0.5, 0.6, an outlier of 10 s, and 0.5; a
  // re-sent step 4 and other ranks' reports do not count.
  Send("n1", TimedStep(name, 1, 5.0));
  Send("n1", TimedStep(name, 2, 4.0));
  EXPECT_FALSE(Get(name).has_plan_check());
  int64_t step = 3;
  for (double seconds : {0.4, 0.5, 0.6, 10.0, 0.5}) Send("n1", TimedStep(name, step++, seconds));
  Send("n1", TimedStep(name, 4, 9.0));
  v1::WorkerMessage other = TimedStep(name, 8, 9.0);
  other.mutable_step()->set_rank(1);
  Send("n1", other);

  v1::PlanCheck check = Get(name).plan_check();
  EXPECT_EQ(check.measured_steps(), 5);
  EXPECT_DOUBLE_EQ(check.measured_step_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(check.predicted_step_seconds(), predicted);
  EXPECT_DOUBLE_EQ(check.ratio(), 0.5 / predicted);
  EXPECT_DOUBLE_EQ(check.measured_phases().forward(), 0.125);
  EXPECT_DOUBLE_EQ(check.measured_phases().backward(), 0.25);
  EXPECT_DOUBLE_EQ(check.measured_data_seconds(), 0.01);
  EXPECT_DOUBLE_EQ(check.predicted_phases().forward(), planned.plan().phases().forward());
  EXPECT_EQ(check.generation(), 1);

  // Persisted with the throttled progress write.
  clock_.Advance(absl::Seconds(2));
  manager_->Tick();
  EXPECT_DOUBLE_EQ(store_->GetJob(name)->job.plan_check().measured_step_seconds(), 0.5);

  text = registry.Serialize();
  EXPECT_THAT(text, HasSubstr(absl::StrCat("loom_job_step_seconds{job=\"", id, "\"} 0.5")));

  ASSERT_TRUE(manager_->CancelJob(name).ok());
  EXPECT_DOUBLE_EQ(Get(name).plan_check().measured_step_seconds(), 0.5);  // kept at the end
  text = registry.Serialize();
  EXPECT_THAT(text, Not(HasSubstr("loom_job_step_seconds{")));
  EXPECT_THAT(text, Not(HasSubstr("loom_job_predicted_step_seconds{")));
}

// The parallel runtime's per-rank telemetry: the ratios of each rank's latest step and its bytes
// per collective kind become loom_rank_* series; a re-sent step is not counted twice, an unknown
// kind is counted as "other" (no new label value), and the series go when the job ends.
TEST_F(JobManagerTest, RankRatiosAndCommBytesAreExported) {
  metrics::Registry registry;
  server_metrics::ServerMetrics metrics(&registry);
  NewManagerWithMetrics(&metrics);

  auto sink = Connect("n1", 2);
  const std::string name = CreateScheduled(CpuSpec(2), *sink);
  const std::string id = name.substr(5);
  StartAll("n1", name, 1, 2);
  EXPECT_THAT(registry.Serialize(), Not(HasSubstr("loom_rank_")));  // nothing reported yet

  auto step = [&](int rank, int64_t n, double idle) {
    v1::WorkerMessage m = Step(name, 1, rank, n, 100, 3.0);
    v1::StepReport* r = m.mutable_step();
    r->set_overlap_ratio(0.5);
    r->set_bubble_ratio(0.25);
    r->set_idle_ratio(idle);
    (*r->mutable_comm_bytes())["all_reduce"] = 1000;
    (*r->mutable_comm_bytes())["pp_send_recv"] = 0;
    (*r->mutable_comm_bytes())["bogus_kind"] = 7;
    (*r->mutable_comm_bytes())["another_bogus_kind"] = 3;
    return m;
  };
  Send("n1", step(0, 1, 0.125));
  Send("n1", step(0, 2, 0.375));
  Send("n1", step(0, 2, 0.375));  // re-sent: its bytes are not counted again
  Send("n1", step(1, 1, 0.0625));
  v1::WorkerMessage bad = step(1, 2, 1.5);  // out of range: the ratios are not taken
  Send("n1", bad);

  std::string text = registry.Serialize();
  const std::string r0 = absl::StrCat("{job=\"", id, "\",rank=\"0\"}");
  const std::string r1 = absl::StrCat("{job=\"", id, "\",rank=\"1\"}");
  EXPECT_THAT(text, HasSubstr("# TYPE loom_rank_idle_ratio gauge"));
  EXPECT_THAT(text, HasSubstr("# TYPE loom_rank_comm_bytes_total counter"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("loom_rank_idle_ratio", r0, " 0.375")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("loom_rank_idle_ratio", r1, " 0.0625")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("loom_rank_bubble_ratio", r0, " 0.25")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("loom_rank_overlap_ratio", r0, " 0.5")));
  const std::string bytes0 = absl::StrCat("loom_rank_comm_bytes_total{job=\"", id, "\",kind=\"");
  EXPECT_THAT(text, HasSubstr(absl::StrCat(bytes0, "all_reduce\",rank=\"0\"} 2000")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(bytes0, "pp_send_recv\",rank=\"0\"} 0")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(bytes0, "other\",rank=\"0\"} 20")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(bytes0, "all_reduce\",rank=\"1\"} 2000")));
  EXPECT_THAT(text, Not(HasSubstr("bogus")));

  // Counters keep counting across scrapes.
  Send("n1", step(0, 3, 0.375));
  text = registry.Serialize();
  EXPECT_THAT(text, HasSubstr(absl::StrCat(bytes0, "all_reduce\",rank=\"0\"} 3000")));

  ASSERT_TRUE(manager_->CancelJob(name).ok());
  text = registry.Serialize();
  EXPECT_THAT(text, Not(HasSubstr("loom_rank_idle_ratio{")));
  EXPECT_THAT(text, Not(HasSubstr("loom_rank_overlap_ratio{")));
  EXPECT_THAT(text, Not(HasSubstr("loom_rank_comm_bytes_total{")));
}

// The profiler's memory statistics: loom_rank_memory_bytes for every rank, the loom_gpu_* series
// only for ranks that report from a CUDA device; the device allocation counter counts a re-sent
// step once, and every series goes when the job ends.
TEST_F(JobManagerTest, RankMemoryAndGpuAllocatorSeriesAreExported) {
  metrics::Registry registry;
  server_metrics::ServerMetrics metrics(&registry);
  NewManagerWithMetrics(&metrics);

  auto sink = Connect("n1", 2);
  const std::string name = CreateScheduled(CpuSpec(2), *sink);
  const std::string id = name.substr(5);
  StartAll("n1", name, 1, 2);
  EXPECT_THAT(registry.Serialize(), Not(HasSubstr("loom_rank_memory_bytes")));  // none reported
  EXPECT_THAT(registry.Serialize(), Not(HasSubstr("loom_gpu_")));

  // Rank 1 trains on the CPU (its reserved bytes are its allocated bytes).
  v1::WorkerMessage cpu = Step(name, 1, /*rank=*/1, /*step=*/1, 100, 3.0);
  cpu.mutable_step()->set_memory_bytes(1048576);
  cpu.mutable_step()->set_peak_memory_bytes(2097152);
  cpu.mutable_step()->set_rss_bytes(7654321);
  cpu.mutable_step()->set_reserved_memory_bytes(1048576);
  cpu.mutable_step()->set_device("cpu");
  Send("n1", cpu);
  std::string text = registry.Serialize();
  const std::string memory = absl::StrCat("loom_rank_memory_bytes{job=\"", id, "\",kind=\"");
  EXPECT_THAT(text, HasSubstr("# TYPE loom_rank_memory_bytes gauge"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(memory, "allocated\",rank=\"1\"} 1048576\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(memory, "peak\",rank=\"1\"} 2097152\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(memory, "rss\",rank=\"1\"} 7654321\n")));
  EXPECT_THAT(text, Not(HasSubstr("loom_gpu_")));  // a CPU rank has no device series

  // Rank 0 trains on a GPU.
  auto gpu = [&](int64_t n, double fragmentation, uint64_t allocations) {
    v1::WorkerMessage m = Step(name, 1, /*rank=*/0, n, 100, 3.0);
    v1::StepReport* r = m.mutable_step();
    r->set_memory_bytes(3145728);
    r->set_peak_memory_bytes(5242880);
    r->set_rss_bytes(123456789);
    r->set_reserved_memory_bytes(23068672);
    r->set_memory_fragmentation(fragmentation);
    r->set_device_allocations(allocations);
    r->set_device("cuda:0");
    return m;
  };
  Send("n1", gpu(1, 0.25, 7));
  Send("n1", gpu(2, 0.125, 2));
  Send("n1", gpu(2, 0.125, 2));  // re-sent: its allocations are not counted again
  Send("n1", gpu(3, 0.125, 0));

  text = registry.Serialize();
  const std::string r0 = absl::StrCat("{job=\"", id, "\",rank=\"0\"}");
  const std::string gpu_memory = absl::StrCat("loom_gpu_memory_bytes{job=\"", id, "\",kind=\"");
  EXPECT_THAT(text, HasSubstr("# TYPE loom_gpu_memory_bytes gauge"));
  EXPECT_THAT(text, HasSubstr("# TYPE loom_gpu_memory_fragmentation_ratio gauge"));
  EXPECT_THAT(text, HasSubstr("# TYPE loom_gpu_device_allocations_total counter"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(gpu_memory, "allocated\",rank=\"0\"} 3145728\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(gpu_memory, "reserved\",rank=\"0\"} 23068672\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(gpu_memory, "peak\",rank=\"0\"} 5242880\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("loom_gpu_memory_fragmentation_ratio", r0, " 0.125\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("loom_gpu_device_allocations_total", r0, " 9\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(memory, "allocated\",rank=\"0\"} 3145728\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(memory, "peak\",rank=\"0\"} 5242880\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(memory, "rss\",rank=\"0\"} 123456789\n")));
  // Still nothing on the GPU side for the CPU rank: every loom_gpu_* series is rank 0's.
  for (const char* gpu_series : {"loom_gpu_memory_bytes{", "loom_gpu_memory_fragmentation_ratio{",
                                 "loom_gpu_device_allocations_total{"}) {
    size_t count = 0;
    for (size_t at = text.find(gpu_series); at != std::string::npos;
         at = text.find(gpu_series, at + 1)) {
      EXPECT_THAT(text.substr(at, text.find('\n', at) - at), HasSubstr("rank=\"0\""));
      ++count;
    }
    EXPECT_EQ(count, std::string_view(gpu_series) == "loom_gpu_memory_bytes{" ? 3u : 1u)
        << gpu_series;
  }

  // A fragmentation outside [0, 1] is not exported; the counter keeps counting.
  Send("n1", gpu(4, 1.5, 1));
  text = registry.Serialize();
  EXPECT_THAT(text, Not(HasSubstr("loom_gpu_memory_fragmentation_ratio{")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("loom_gpu_device_allocations_total", r0, " 10\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(gpu_memory, "reserved\",rank=\"0\"} 23068672\n")));

  ASSERT_TRUE(manager_->CancelJob(name).ok());
  text = registry.Serialize();
  EXPECT_THAT(text, Not(HasSubstr("loom_rank_memory_bytes{")));
  EXPECT_THAT(text, Not(HasSubstr("loom_gpu_memory_bytes{")));
  EXPECT_THAT(text, Not(HasSubstr("loom_gpu_memory_fragmentation_ratio{")));
  EXPECT_THAT(text, Not(HasSubstr("loom_gpu_device_allocations_total{")));
}

TEST(ServerMetricsTest, CommKindsOutsideTheKnownSetAreOther) {
  for (std::string_view kind : server_metrics::kCommKinds) {
    EXPECT_EQ(server_metrics::CommKindLabel(kind), kind);
  }
  EXPECT_EQ(server_metrics::CommKindLabel("all_to_all"), std::string_view("other"));
  EXPECT_EQ(server_metrics::CommKindLabel(""), std::string_view("other"));
}

TEST(LogStoreTest, CapsTheSizeWithAMarker) {
  store::testing::TempDir dir;
  auto logs = LogStore::Open(dir.File("logs"), /*max_bytes_per_job=*/200);
  ASSERT_TRUE(logs.ok());
  v1::LogChunk chunk;
  chunk.set_generation(1);
  chunk.set_rank(0);
  for (int i = 0; i < 20; ++i) chunk.add_lines("0123456789012345678901234567890123456789");
  ASSERT_TRUE((*logs)->Append("abc", chunk, "nodes/n1", absl::Now()).ok());
  ASSERT_TRUE((*logs)->Append("abc", chunk, "nodes/n1", absl::Now()).ok());
  absl::StatusOr<LogBatch> batch = (*logs)->Read("abc", 0, std::nullopt);
  ASSERT_TRUE(batch.ok());
  ASSERT_FALSE(batch->lines.empty());
  EXPECT_LT(batch->lines.size(), 5u);
  EXPECT_THAT(batch->lines.back().text(), HasSubstr("log truncated"));
  EXPECT_EQ((*logs)->Append("../x", chunk, "n", absl::Now()).code(),
            absl::StatusCode::kInvalidArgument);
}

// The dashboard's job and rank series: rank 0's step, loss, throughput and the age of its last
// report; the measured MFU scaled from the plan's; per-rank phase seconds summed once per step
// (an unknown phase as "other", a negative figure ignored); the device memory the rank's gauges
// are compared with; all gone when the job ends.
TEST_F(JobManagerTest, ProgressPhasesAndDeviceMemoryAreExported) {
  metrics::Registry registry;
  server_metrics::ServerMetrics metrics(&registry);
  NewManagerWithMetrics(&metrics);

  v1::RegisterNodeRequest node = CpuNode("n1", 2);
  node.mutable_devices(0)->set_memory_bytes(uint64_t{8} << 30);
  node.mutable_devices(1)->set_memory_bytes(uint64_t{8} << 30);
  ASSERT_TRUE(manager_->RegisterNode(node).ok());
  auto sink = Reconnect("n1");
  const std::string name = CreateScheduled(CpuSpec(2), *sink);  // `auto`: planned, with an MFU
  const std::string id = name.substr(5);
  StartAll("n1", name, 1, 2);
  const v1::Job planned = Get(name);
  ASSERT_GT(planned.plan().mfu(), 0);
  std::string text = registry.Serialize();
  const std::string job = absl::StrCat("{job=\"", id, "\"}");
  EXPECT_THAT(text, HasSubstr(absl::StrCat("loom_job_restarts", job, " 0\n")));
  EXPECT_THAT(text, Not(HasSubstr("loom_job_step{")));  // nothing reported yet

  auto step = [&](int rank, int64_t n, double forward) {
    v1::WorkerMessage m = Step(name, 1, rank, n, 100, 2.5);
    v1::StepReport* r = m.mutable_step();
    (*r->mutable_phase_seconds())["forward"] = forward;
    (*r->mutable_phase_seconds())["backward"] = 0.25;
    (*r->mutable_phase_seconds())["made_up_phase"] = 0.125;
    (*r->mutable_phase_seconds())["optimizer"] = -1.0;  // ignored
    return m;
  };
  for (int64_t n = 1; n <= 5; ++n) {
    Send("n1", step(0, n, 0.125));
    Send("n1", step(1, n, 0.0625));
  }
  Send("n1", step(0, 5, 0.125));  // re-sent: not counted again
  // An evaluation report (no loss, no throughput) leaves the job's loss and tokens/s alone.
  v1::WorkerMessage eval = Step(name, 1, /*rank=*/0, 5, 100, 0.0);
  eval.mutable_step()->set_has_val_loss(true);
  eval.mutable_step()->set_val_loss(2.75);
  eval.mutable_step()->set_tokens_per_second(0);
  Send("n1", eval);

  text = registry.Serialize();
  const std::string r0 = absl::StrCat("{job=\"", id, "\",rank=\"0\"}");
  const std::string phase0 =
      absl::StrCat("loom_rank_phase_seconds_total{job=\"", id, "\",phase=\"");
  EXPECT_THAT(text, HasSubstr("# TYPE loom_rank_phase_seconds_total counter"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(phase0, "forward\",rank=\"0\"} 0.625\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(phase0, "forward\",rank=\"1\"} 0.3125\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(phase0, "backward\",rank=\"0\"} 1.25\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(phase0, "other\",rank=\"0\"} 0.625\n")));
  EXPECT_THAT(text, Not(HasSubstr("made_up_phase")));
  EXPECT_THAT(text, Not(HasSubstr("phase=\"optimizer\"")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("loom_rank_step_seconds", r0, " 0.5\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("loom_rank_device_memory_bytes", r0, " 8589934592\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("loom_job_step", job, " 5\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("loom_job_loss", job, " 2.5\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("loom_job_tokens_per_second", job, " 1000\n")));
  // The value of one series, as a number (the exposition may write 1.7e+09 or 1700000000).
  auto value = [&](const std::string& series) -> double {
    const size_t at = text.find(series + " ");
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + series.size() + 1));
  };
  EXPECT_DOUBLE_EQ(value(absl::StrCat("loom_job_last_step_timestamp_seconds", job)),
                   absl::ToDoubleSeconds(clock_.Now() - absl::UnixEpoch()));
  // The measured step (0.5 s) against the plan's: MFU scales by predicted / measured.
  const double mfu = planned.plan().mfu() * planned.plan().step_seconds() / 0.5;
  EXPECT_NEAR(value(absl::StrCat("loom_job_mfu_ratio", job)), mfu, 1e-9 * mfu);

  ASSERT_TRUE(manager_->CancelJob(name).ok());
  text = registry.Serialize();
  for (const char* series :
       {"loom_job_step{", "loom_job_loss{", "loom_job_mfu_ratio{", "loom_job_restarts{",
        "loom_rank_phase_seconds_total{", "loom_rank_device_memory_bytes{"}) {
    EXPECT_THAT(text, Not(HasSubstr(series))) << series;
  }
}

}  // namespace
}  // namespace loom::jobs
