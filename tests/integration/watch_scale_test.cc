// WatchJob and StreamJobLogs on the callback API: many open streams on one real loomd cost no
// thread each, every watch receives the final state and every log follower ends with the job,
// and one caller's open streams are bounded (--max-streams-per-client) with a
// RESOURCE_EXHAUSTED that names the flag.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "loom/v1/job.grpc.pb.h"
#include "loom/v1/node.grpc.pb.h"
#include "tests/integration/cluster.h"

namespace loom::testing {
namespace {

// Streams per test: 1,000 in CI; LOOM_WATCH_SCALE_STREAMS raises it for the benchmark record
// (docs/benchmarks.md: 10,000 watches on one loomd).
int StreamsFromEnv() {
  int n = 1000;
  const char* env = std::getenv("LOOM_WATCH_SCALE_STREAMS");
  if (env != nullptr && (!absl::SimpleAtoi(env, &n) || n < 1 || n > 100000)) n = 1000;
  return n;
}
const int kWatchers = StreamsFromEnv();
// Waits grow with the number of streams (the first updates of 10,000 take seconds on 2 cores).
const absl::Duration kStreamWait = absl::Seconds(30 + kWatchers / 100);
// Client channels (HTTP/2 connections) the streams are spread over.
const int kChannels = std::max(4, kWatchers / 250);

// The number of threads of process `pid` (/proc/PID/status), or -1.
int ThreadCount(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) {
      int n = -1;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(8)), &n)) return n;
    }
  }
  return -1;
}

// One WatchJob stream read with the client callback API (no thread per stream here either).
class Watcher final : public grpc::ClientReadReactor<v1::JobUpdate> {
 public:
  Watcher(v1::JobService::Stub* stub, const std::string& job) {
    request_.set_name(job);
    stub->async()->WatchJob(&context_, &request_, this);
    StartRead(&update_);
    StartCall();
  }
  // A stream still open is cancelled and waited for: its context must outlive the call.
  ~Watcher() {
    context_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(30));
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    {
      absl::MutexLock lock(&mu_);
      ++updates_;
      last_state_ = update_.job().state();
    }
    StartRead(&update_);
  }
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }
  int updates() {
    absl::MutexLock lock(&mu_);
    return updates_;
  }
  bool done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  v1::JobState last_state() {
    absl::MutexLock lock(&mu_);
    return last_state_;
  }
  grpc::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  void Cancel() { context_.TryCancel(); }

 private:
  grpc::ClientContext context_;
  v1::WatchJobRequest request_;
  v1::JobUpdate update_;
  absl::Mutex mu_;
  int updates_ ABSL_GUARDED_BY(mu_) = 0;
  v1::JobState last_state_ ABSL_GUARDED_BY(mu_) = v1::JOB_STATE_UNSPECIFIED;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

// One StreamJobLogs stream with follow, read with the client callback API.
class LogFollower final : public grpc::ClientReadReactor<v1::LogLine> {
 public:
  LogFollower(v1::JobService::Stub* stub, const std::string& job) {
    request_.set_name(job);
    request_.set_follow(true);
    stub->async()->StreamJobLogs(&context_, &request_, this);
    StartRead(&line_);
    StartCall();
  }
  ~LogFollower() {
    context_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(30));
  }
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&line_);
  }
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }
  bool done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  grpc::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  grpc::ClientContext context_;
  v1::StreamJobLogsRequest request_;
  v1::LogLine line_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

class WatchScaleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterOptions options;
    options.workers = 0;
    options.secure = false;
    options.node_timeout_ms = 600'000;
    options.heartbeat_interval_ms = 100'000;
    options.loomd_flags = {absl::StrCat("--max-streams-per-client=", kWatchers)};
    cluster_ = std::make_unique<Cluster>(options);
    ASSERT_TRUE(cluster_->Start().ok()) << cluster_->LogTails();
    // Jobs must pass validation: a node with devices (it never opens a session, so the job
    // stays QUEUED until it is cancelled).
    grpc::ClientContext context;
    v1::RegisterNodeRequest node;
    node.set_node_id("watch-node");
    node.set_hostname("localhost");
    v1::Device* d = node.add_devices();
    d->set_kind(v1::DEVICE_KIND_CPU);
    d->set_index(0);
    v1::RegisterNodeResponse registered;
    ASSERT_TRUE(cluster_->nodes().RegisterNode(&context, node, &registered).ok());
  }

  std::string CreateJob() {
    grpc::ClientContext context;
    v1::CreateJobRequest request;
    request.mutable_spec()->mutable_model()->set_preset("tiny");
    request.mutable_spec()->mutable_data()->set_builtin("tiny-corpus");
    request.mutable_spec()->mutable_train()->set_steps(1);
    request.mutable_spec()->mutable_resources()->set_cpu_devices(1);
    v1::Job job;
    const grpc::Status s = cluster_->jobs().CreateJob(&context, request, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job.name();
  }

  std::unique_ptr<Cluster> cluster_;
};

TEST_F(WatchScaleTest, AThousandWatchersHoldNoThreadEachAndAllSeeTheEnd) {
  const std::string job = CreateJob();
  const int threads_before = ThreadCount(cluster_->loomd().pid());
  ASSERT_GT(threads_before, 0);

  std::vector<std::unique_ptr<v1::JobService::Stub>> stubs;
  for (int c = 0; c < kChannels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.use_local_subchannel_pool", 1);
    stubs.push_back(v1::JobService::NewStub(grpc::CreateCustomChannel(
        cluster_->loomd_address(), grpc::InsecureChannelCredentials(), args)));
  }
  std::vector<std::unique_ptr<Watcher>> watchers;
  for (int i = 0; i < kWatchers; ++i) {
    watchers.push_back(std::make_unique<Watcher>(stubs[i % stubs.size()].get(), job));
  }
  auto count = [&](auto predicate) {
    int n = 0;
    for (auto& w : watchers) n += predicate(*w) ? 1 : 0;
    return n;
  };
  ASSERT_TRUE(WaitFor(
      [&] { return count([](Watcher& w) { return w.updates() >= 1; }) == kWatchers; }, kStreamWait))
      << count([](Watcher& w) { return w.updates() >= 1; }) << " of " << kWatchers
      << " watchers got the first update\n"
      << cluster_->LogTails();
  // Every watch is open now; a thread per stream would show as kWatchers more threads.
  const int threads_open = ThreadCount(cluster_->loomd().pid());
  EXPECT_LT(threads_open, threads_before + 50)
      << "loomd has " << threads_open << " threads with " << kWatchers
      << " open watches (before: " << threads_before << ")";
  EXPECT_LT(threads_open, 100);
  std::cout << "loomd threads: " << threads_before << " before, " << threads_open << " with "
            << kWatchers << " open watches\n";

  // One stream over the caller's bound is refused, naming the flag.
  {
    Watcher extra(stubs[0].get(), job);
    ASSERT_TRUE(WaitFor([&] { return extra.done(); }, absl::Seconds(10)));
    EXPECT_EQ(extra.status().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(extra.status().error_message(), ::testing::HasSubstr("--max-streams-per-client"));
  }

  grpc::ClientContext context;
  v1::CancelJobRequest cancel;
  cancel.set_name(job);
  v1::Job cancelled;
  ASSERT_TRUE(cluster_->jobs().CancelJob(&context, cancel, &cancelled).ok());
  ASSERT_TRUE(
      WaitFor([&] { return count([](Watcher& w) { return w.done(); }) == kWatchers; }, kStreamWait))
      << count([](Watcher& w) { return w.done(); }) << " of " << kWatchers << " streams ended";
  for (auto& w : watchers) {
    EXPECT_TRUE(w->status().ok()) << w->status().error_message();
    EXPECT_EQ(w->last_state(), v1::CANCELLED);
  }
}

TEST_F(WatchScaleTest, StreamsClosedByTheClientFreeTheirPlaces) {
  const std::string job = CreateJob();
  auto stub = v1::JobService::NewStub(cluster_->channel());
  for (int round = 0; round < 2; ++round) {
    // Twice the bound in total: only possible when cancelled streams give their place back.
    // loomd learns of a cancel a little after the client, so a stream of the second round may
    // still be refused for a moment; such a one is opened again.
    std::vector<std::unique_ptr<Watcher>> watchers(kWatchers);
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    int open = 0;
    while (open < kWatchers && absl::Now() < deadline) {
      open = 0;
      for (auto& w : watchers) {
        if (w != nullptr && w->done()) {
          ASSERT_EQ(w->status().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
              << w->status().error_message();
          w.reset();
        }
        if (w == nullptr) w = std::make_unique<Watcher>(stub.get(), job);
        open += w->updates() >= 1 ? 1 : 0;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_EQ(open, kWatchers) << "round " << round;
    for (auto& w : watchers) w->Cancel();
    ASSERT_TRUE(WaitFor(
        [&] {
          for (auto& w : watchers) {
            if (!w->done()) return false;
          }
          return true;
        },
        absl::Seconds(30)));
  }
}

TEST_F(WatchScaleTest, AThousandLogFollowersHoldNoThreadEachAndEndWithTheJob) {
  const std::string job = CreateJob();
  const int threads_before = ThreadCount(cluster_->loomd().pid());
  auto stub = v1::JobService::NewStub(cluster_->channel());
  std::vector<std::unique_ptr<LogFollower>> followers;
  for (int i = 0; i < kWatchers; ++i) {
    followers.push_back(std::make_unique<LogFollower>(stub.get(), job));
  }
  // The job has no logs and runs nowhere: every follower waits. Give them time to be opened.
  absl::SleepFor(absl::Seconds(1));
  for (auto& f : followers) ASSERT_FALSE(f->done()) << f->status().error_message();
  const int threads_open = ThreadCount(cluster_->loomd().pid());
  EXPECT_LT(threads_open, threads_before + 50)
      << "loomd has " << threads_open << " threads with " << kWatchers << " log followers";
  std::cout << "loomd threads: " << threads_before << " before, " << threads_open << " with "
            << kWatchers << " log followers\n";

  grpc::ClientContext context;
  v1::CancelJobRequest cancel;
  cancel.set_name(job);
  v1::Job cancelled;
  ASSERT_TRUE(cluster_->jobs().CancelJob(&context, cancel, &cancelled).ok());
  ASSERT_TRUE(WaitFor(
      [&] {
        for (auto& f : followers) {
          if (!f->done()) return false;
        }
        return true;
      },
      absl::Seconds(30)));
  for (auto& f : followers) EXPECT_TRUE(f->status().ok()) << f->status().error_message();
}

// One worker's Session stream, driven with the client callback API: it sends `hello` and
// reads whatever loomd sends until the stream ends.
class FakeWorkerSession final
    : public grpc::ClientBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
 public:
  FakeWorkerSession(v1::NodeService::Stub* stub, const std::string& node) {
    hello_.mutable_hello()->set_node_id(node);
    stub->async()->Session(&context_, this);
    StartWrite(&hello_);
    StartRead(&in_);
    StartCall();
  }
  ~FakeWorkerSession() {
    context_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(30));
  }
  void OnWriteDone(bool) override {}
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&in_);
  }
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }
  bool done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  grpc::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  grpc::ClientContext context_;
  v1::WorkerMessage hello_;
  v1::CoordinatorMessage in_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

// Worker sessions on the callback API: hundreds of open sessions cost loomd no thread each; a
// second session for a live node is refused (ALREADY_EXISTS) without disturbing the first; a
// session loomd ends (the node deleted) ends ABORTED with why.
TEST_F(WatchScaleTest, WorkerSessionsHoldNoThreadEach) {
  const int sessions = std::max(50, kWatchers / 5);
  auto stub = v1::NodeService::NewStub(
      grpc::CreateChannel(cluster_->loomd_address(), grpc::InsecureChannelCredentials()));
  for (int i = 0; i < sessions; ++i) {
    grpc::ClientContext context;
    v1::RegisterNodeRequest node;
    node.set_node_id(absl::StrCat("session-node-", i));
    node.set_hostname("localhost");
    v1::Device* d = node.add_devices();
    d->set_kind(v1::DEVICE_KIND_CPU);
    d->set_index(0);
    v1::RegisterNodeResponse registered;
    ASSERT_TRUE(stub->RegisterNode(&context, node, &registered).ok());
  }
  const int threads_before = ThreadCount(cluster_->loomd().pid());
  std::vector<std::unique_ptr<FakeWorkerSession>> open;
  for (int i = 0; i < sessions; ++i) {
    open.push_back(
        std::make_unique<FakeWorkerSession>(stub.get(), absl::StrCat("session-node-", i)));
  }
  // A live node's second session is refused; the first stays.
  FakeWorkerSession second(stub.get(), "session-node-0");
  ASSERT_TRUE(WaitFor([&] { return second.done(); }, absl::Seconds(30)));
  EXPECT_EQ(second.status().error_code(), grpc::StatusCode::ALREADY_EXISTS)
      << second.status().error_message();
  absl::SleepFor(absl::Seconds(1));
  for (int i = 0; i < sessions; ++i) {
    ASSERT_FALSE(open[i]->done()) << "session " << i << ": " << open[i]->status().error_message();
  }
  const int threads_open = ThreadCount(cluster_->loomd().pid());
  EXPECT_LT(threads_open, threads_before + 50)
      << "loomd has " << threads_open << " threads with " << sessions << " worker sessions";
  EXPECT_LT(threads_open, 100);
  std::cout << "loomd threads: " << threads_before << " before, " << threads_open << " with "
            << sessions << " worker sessions\n";

  // loomd ends a session: the node is deleted (force, as it is READY).
  {
    grpc::ClientContext context;
    v1::DeleteNodeRequest request;
    request.set_name("nodes/session-node-1");
    request.set_force(true);
    v1::DeleteNodeResponse response;
    const grpc::Status s = stub->DeleteNode(&context, request, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_TRUE(WaitFor([&] { return open[1]->done(); }, absl::Seconds(30)));
  EXPECT_EQ(open[1]->status().error_code(), grpc::StatusCode::ABORTED)
      << open[1]->status().error_message();
  EXPECT_THAT(open[1]->status().error_message(), ::testing::HasSubstr("loomd ended this session"));
  EXPECT_FALSE(open[0]->done());
}

}  // namespace
}  // namespace loom::testing
