// Timelines inside the JobManager (no network): GetJobTrace validates the step range, asks each
// node of a running gang for its ranks' events, returns what came with every rank's coordinates,
// names a node that did not answer in time, and bounds what it accepts (TraceCollector).
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/jobs/default_spec_validator.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/trace_collector.h"
#include "server/store/job_store.h"
#include "tests/server/loomd_test_util.h"
#include "tests/server/store_test_util.h"

namespace loom::jobs {
namespace {

using ::loom::testing::CpuNode;
using ::loom::testing::CpuSpec;
using ::loom::testing::CreateRequest;
using ::loom::testing::FakeSink;
using ::loom::testing::RankPhase;
using ::testing::HasSubstr;

v1::TraceEvent Event(v1::TraceEventKind kind, int64_t step, int micro) {
  v1::TraceEvent e;
  e.set_kind(kind);
  e.set_start_unix_nanos(1'700'000'000'000'000'000 + step * 1000);
  e.set_duration_nanos(100);
  e.set_step(step);
  e.set_micro_batch(micro);
  return e;
}

v1::TraceChunk Chunk(uint64_t id, int rank, int events, bool last) {
  v1::TraceChunk c;
  c.set_request_id(id);
  c.set_rank(rank);
  c.set_last(last);
  for (int i = 0; i < events; ++i) *c.add_events() = Event(v1::TRACE_EVENT_KIND_FORWARD, 1, i);
  return c;
}

TEST(TraceStepsTest, RangesAreValidatedNamingTheField) {
  EXPECT_TRUE(ValidateTraceSteps(0, 0).ok());
  EXPECT_TRUE(ValidateTraceSteps(3, 3).ok());
  EXPECT_TRUE(ValidateTraceSteps(1, 64).ok());
  EXPECT_THAT(ValidateTraceSteps(0, 5).message(), HasSubstr("first_step must be >= 1"));
  EXPECT_THAT(ValidateTraceSteps(6, 5).message(), HasSubstr("last_step (5) must be >= first_step"));
  absl::Status wide = ValidateTraceSteps(1, 65);
  EXPECT_EQ(wide.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wide.message(), HasSubstr("at most 64"));
}

TEST(TraceCollectorTest, KeepsOnlyAskedNodesAndRanksWithinTheEventBound) {
  TraceCollector c;
  absl::StatusOr<uint64_t> id = c.Open({{"nodes/a", {0, 1}}, {"nodes/b", {2}}}, 5);
  ASSERT_TRUE(id.ok());
  c.Accept("nodes/a", Chunk(*id, 0, 3, false));
  c.Accept("nodes/a", Chunk(*id, 2, 3, false));       // rank 2 is not on a: dropped
  c.Accept("nodes/x", Chunk(*id, 0, 3, true));        // not asked: dropped
  c.Accept("nodes/a", Chunk(*id + 100, 0, 3, true));  // another request: dropped
  c.Accept("nodes/a", Chunk(*id, 1, 3, false));       // 2 of 3 fit the bound of 5
  v1::TraceChunk last = Chunk(*id, -1, 0, true);
  last.add_notes("rank 1: 2 torn record(s) skipped");
  c.Accept("nodes/a", last);
  c.Accept("nodes/a", Chunk(*id, 0, 1, true));  // after its last chunk: dropped
  TraceCollector::Result r = c.Wait(*id, absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(r.answered, (std::set<std::string>{"nodes/a"}));
  EXPECT_EQ(r.events[0].size(), 3u);
  EXPECT_EQ(r.events[1].size(), 2u);
  EXPECT_FALSE(r.events.contains(2));
  EXPECT_TRUE(r.truncated);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_EQ(r.notes[0], "nodes/a: rank 1: 2 torn record(s) skipped");
  // Forgotten once waited for.
  EXPECT_TRUE(c.Wait(*id, absl::Now()).answered.empty());
}

TEST(TraceCollectorTest, BoundsTheRequestsInFlight) {
  TraceCollector c;
  for (size_t i = 0; i < TraceCollector::kMaxOpen; ++i) ASSERT_TRUE(c.Open({}, 1).ok());
  EXPECT_EQ(c.Open({}, 1).status().code(), absl::StatusCode::kResourceExhausted);
}

class JobManagerTraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = store::NewMemoryJobStore();
    auto logs = LogStore::Open(dir_.File("logs"));
    ASSERT_TRUE(logs.ok()) << logs.status();
    logs_ = std::move(*logs);
    JobManagerOptions options;
    options.rendezvous_address = "loomd.test:7070";
    options.trace_wait = absl::Milliseconds(300);
    auto manager = JobManager::Create(store_.get(), &clock_, MakeSpecValidator(), logs_.get(),
                                      nullptr, nullptr, options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = std::move(*manager);
    for (const char* node : {"n1", "n2"}) {
      ASSERT_TRUE(manager_->RegisterNode(CpuNode(node, 1)).ok());
      auto sink = std::make_shared<FakeSink>();
      v1::SessionHello hello;
      hello.set_node_id(node);
      absl::StatusOr<uint64_t> session = manager_->OpenSession(hello, sink);
      ASSERT_TRUE(session.ok()) << session.status();
      sinks_[node] = sink;
      sessions_[node] = *session;
    }
  }

  void Send(const std::string& node, const v1::WorkerMessage& m) {
    absl::Status s = manager_->HandleWorkerMessage(node, sessions_[node], m);
    ASSERT_TRUE(s.ok()) << s;
  }

  // A data-parallel job of 2 ranks, one on each node, RUNNING.
  std::string RunningDataParallelJob() {
    v1::JobSpec spec = CpuSpec(2);
    spec.mutable_train()->set_steps(1000);
    spec.mutable_parallelism()->set_data(2);
    absl::StatusOr<v1::Job> job = manager_->CreateJob(CreateRequest(spec));
    EXPECT_TRUE(job.ok()) << job.status();
    for (auto& [node, sink] : sinks_) {
      for (const v1::Assignment& a : sink->TakeAssignments()) {
        for (const v1::RankAssignment& r : a.ranks()) {
          Send(node, RankPhase(job->name(), a.generation(), r.rank(), v1::RANK_PHASE_RUNNING));
        }
      }
    }
    return job->name();
  }

  // The TraceRequest sent to `node`, waiting for it up to a second.
  std::optional<v1::TraceRequest> AwaitRequest(const std::string& node) {
    const absl::Time deadline = absl::Now() + absl::Seconds(1);
    while (absl::Now() < deadline) {
      for (const v1::CoordinatorMessage& m : sinks_[node]->Take()) {
        if (m.has_trace_request()) return m.trace_request();
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return std::nullopt;
  }

  store::testing::TempDir dir_;
  FakeClock clock_;
  std::unique_ptr<store::JobStore> store_;
  std::unique_ptr<LogStore> logs_;
  std::unique_ptr<JobManager> manager_;
  std::map<std::string, std::shared_ptr<FakeSink>> sinks_;
  std::map<std::string, uint64_t> sessions_;
};

TEST_F(JobManagerTraceTest, ReturnsTheAnsweringNodesRanksAndNamesTheSilentOne) {
  const std::string job = RunningDataParallelJob();
  v1::GetJobTraceRequest request;
  request.set_name(job);
  request.set_first_step(3);
  request.set_last_step(4);
  absl::StatusOr<v1::JobTrace> trace;
  std::thread caller([&] { trace = manager_->GetJobTrace(request); });
  // Which node holds which rank is the scheduler's choice: answer from whichever node got
  // rank 0's request and leave the other silent.
  std::optional<v1::TraceRequest> r1 = AwaitRequest("n1");
  std::optional<v1::TraceRequest> r2 = AwaitRequest("n2");
  ASSERT_TRUE(r1 && r2);
  const bool n1_has_0 = r1->ranks(0) == 0;
  const std::string answering = n1_has_0 ? "n1" : "n2";
  const v1::TraceRequest& asked = n1_has_0 ? *r1 : *r2;
  EXPECT_EQ(asked.job(), job);
  EXPECT_EQ(asked.first_step(), 3);
  EXPECT_EQ(asked.last_step(), 4);
  EXPECT_EQ(asked.generation(), 1);
  v1::WorkerMessage m;
  *m.mutable_trace_chunk() = Chunk(asked.request_id(), 0, 4, false);
  Send(answering, m);
  *m.mutable_trace_chunk() = Chunk(asked.request_id(), -1, 0, true);
  Send(answering, m);
  caller.join();
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->first_step(), 3);
  ASSERT_EQ(trace->ranks_size(), 1);
  EXPECT_EQ(trace->ranks(0).rank(), 0);
  EXPECT_EQ(trace->ranks(0).stage(), 0);
  EXPECT_EQ(trace->ranks(0).data(), 0);
  EXPECT_EQ(trace->ranks(0).node(), "nodes/" + answering);
  EXPECT_EQ(trace->ranks(0).events_size(), 4);
  ASSERT_EQ(trace->missing_nodes_size(), 1);
  EXPECT_EQ(trace->missing_nodes(0), n1_has_0 ? "nodes/n2" : "nodes/n1");
}

TEST_F(JobManagerTraceTest, RefusesBadRangesAndJobsThatDoNotRun) {
  v1::GetJobTraceRequest request;
  request.set_name("jobs/nope");
  request.set_first_step(1);
  request.set_last_step(2);
  EXPECT_EQ(manager_->GetJobTrace(request).status().code(), absl::StatusCode::kNotFound);
  const std::string job = RunningDataParallelJob();
  request.set_name(job);
  request.set_last_step(100);
  EXPECT_EQ(manager_->GetJobTrace(request).status().code(), absl::StatusCode::kInvalidArgument);
  // The default range needs a step from rank 0.
  request.set_first_step(0);
  request.set_last_step(0);
  absl::Status none = manager_->GetJobTrace(request).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.message(), HasSubstr("no step yet"));
  ASSERT_TRUE(manager_->CancelJob(job).ok());
  request.set_first_step(1);
  request.set_last_step(2);
  absl::Status cancelled = manager_->GetJobTrace(request).status();
  EXPECT_EQ(cancelled.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(cancelled.message(), HasSubstr("RUNNING"));
}

}  // namespace
}  // namespace loom::jobs
