// JobManager's refusals and notices that depend on more than the spec alone: request_id reuse,
// the planner's memory model, where sharded checkpoints land, and a restarted gang that did not
// find its checkpoint. MemoryJobStore, FakeClock and FakeSinks, as job_manager_test.cc.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/jobs/checkpoint_placement.h"
#include "server/jobs/default_spec_validator.h"
#include "server/jobs/job_manager.h"
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
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

class JobManagerSpecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = store::NewMemoryJobStore();
    JobManagerOptions options;
    options.rendezvous_address = "loomd.test:7070";
    auto manager = JobManager::Create(store_.get(), &clock_, MakeSpecValidator(), nullptr, nullptr,
                                      nullptr, options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = std::move(*manager);
  }

  std::shared_ptr<FakeSink> Connect(const v1::RegisterNodeRequest& node) {
    EXPECT_TRUE(manager_->RegisterNode(node).ok());
    auto sink = std::make_shared<FakeSink>();
    v1::SessionHello hello;
    hello.set_node_id(node.node_id());
    sessions_[node.node_id()] = manager_->OpenSession(hello, sink).value_or(0);
    return sink;
  }
  void Send(const std::string& node, const v1::WorkerMessage& message) {
    ASSERT_TRUE(manager_->HandleWorkerMessage(node, sessions_[node], message).ok());
  }
  int JobCount() { return manager_->ListJobs({}).value().jobs_size(); }
  std::vector<std::string> Reasons(const std::string& name) {
    std::vector<std::string> out;
    const v1::Job job = manager_->GetJob(name).value_or(v1::Job());
    for (const v1::JobEvent& e : job.events()) out.push_back(e.reason());
    return out;
  }

  FakeClock clock_;
  std::unique_ptr<store::JobStore> store_;
  std::unique_ptr<JobManager> manager_;
  std::map<std::string, uint64_t> sessions_;
};

v1::RegisterNodeRequest GpuNode(const std::string& id, int gpus) {
  v1::RegisterNodeRequest node;
  node.set_node_id(id);
  node.set_hostname(id + ".local");
  for (int i = 0; i < gpus; ++i) {
    v1::Device* d = node.add_devices();
    d->set_kind(v1::DEVICE_KIND_GPU);
    d->set_index(i);
    d->set_model("NVIDIA H100 80GB HBM3");
    d->set_memory_bytes(int64_t{80} << 30);
  }
  return node;
}

// A GPT-3-sized model (175 B parameters) on GPUs.
v1::JobSpec HugeGpuSpec(int gpus) {
  v1::JobSpec spec;
  spec.mutable_model()->set_layers(96);
  spec.mutable_model()->set_hidden(12288);
  spec.mutable_model()->set_heads(96);
  spec.mutable_model()->set_seq_len(2048);
  spec.mutable_model()->set_vocab(50304);
  spec.mutable_data()->set_builtin("tiny-corpus");
  spec.mutable_train()->set_steps(10);
  spec.mutable_resources()->set_gpus(gpus);
  return spec;
}

TEST_F(JobManagerSpecTest, RequestIdReusedWithAnotherSpecIsRefused) {
  Connect(CpuNode("n1", 2));
  absl::StatusOr<v1::Job> first = manager_->CreateJob(CreateRequest(CpuSpec(2), "req-1"));
  ASSERT_TRUE(first.ok()) << first.status();
  // The same spec, spelling out defaults the first one left out: the same job.
  v1::JobSpec explicit_defaults = CpuSpec(2);
  explicit_defaults.mutable_train()->set_lr(6e-4);
  explicit_defaults.mutable_train()->set_precision("fp32");
  absl::StatusOr<v1::Job> again = manager_->CreateJob(CreateRequest(explicit_defaults, "req-1"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->name(), first->name());

  v1::JobSpec other = CpuSpec(2);
  other.mutable_train()->set_steps(11);
  const absl::Status reused = manager_->CreateJob(CreateRequest(other, "req-1")).status();
  EXPECT_EQ(reused.code(), absl::StatusCode::kAlreadyExists) << reused;
  EXPECT_THAT(std::string(reused.message()), HasSubstr("request_id \"req-1\""));
  EXPECT_THAT(std::string(reused.message()), HasSubstr(first->name()));
  EXPECT_THAT(std::string(reused.message()), HasSubstr("different spec"));
  EXPECT_EQ(JobCount(), 1);
}

v1::CreateJobRequest YamlRequest(const std::string& text, const std::string& request_id = "",
                                 const std::string& source = "job.yaml") {
  v1::CreateJobRequest request;
  request.mutable_spec_yaml()->set_text(text);
  request.mutable_spec_yaml()->set_source(source);
  request.set_request_id(request_id);
  return request;
}

constexpr char kCpuSpecYaml[] =
    "name: test-job\n"
    "model: {preset: tiny}\n"
    "data: {builtin: tiny-corpus}\n"
    "train: {steps: 10}\n"
    "resources: {cpu_devices: 2}\n"
    "restart: {max_restarts: 0, backoff_seconds: 1}\n";

// A spec sent as YAML (what loomctl submit sends) is the job the same spec as a message makes:
// one job for both under one request_id, whichever came first.
TEST_F(JobManagerSpecTest, ASpecSentAsYamlIsTheSameSpecAsTheMessage) {
  Connect(CpuNode("n1", 2));
  absl::StatusOr<v1::Job> from_yaml = manager_->CreateJob(YamlRequest(kCpuSpecYaml, "req-1"));
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status();
  EXPECT_EQ(from_yaml->spec().resources().cpu_devices(), 2);
  EXPECT_EQ(from_yaml->spec().model().preset(), "tiny");
  absl::StatusOr<v1::Job> from_message = manager_->CreateJob(CreateRequest(CpuSpec(2), "req-1"));
  ASSERT_TRUE(from_message.ok()) << from_message.status();
  EXPECT_EQ(from_message->name(), from_yaml->name());
  absl::StatusOr<v1::Job> again = manager_->CreateJob(YamlRequest(kCpuSpecYaml, "req-1"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->name(), from_yaml->name());
  EXPECT_EQ(JobCount(), 1);
}

// Untrusted YAML from the wire: every error is INVALID_ARGUMENT naming the source, line and key
// (or the field of JobSpecYaml), nothing is stored, and no input crashes loomd.
TEST_F(JobManagerSpecTest, BadYamlIsRefusedWithItsLineAndNothingIsStored) {
  Connect(CpuNode("n1", 2));
  struct Case {
    v1::CreateJobRequest request;
    std::string expected;
  };
  std::vector<Case> cases;
  cases.push_back({YamlRequest("resources: {cpu_devices: 2\n"), "job.yaml:2:1: YAML syntax error"});
  cases.push_back({YamlRequest("model: {layrs: 2}\n"), "job.yaml:1:9: model.layrs: unknown key"});
  cases.push_back({YamlRequest("resources: {cpu_devices: two}\n", "", ""),
                   "spec_yaml:1:26: resources.cpu_devices"});
  cases.push_back({YamlRequest(""), "job.yaml: the job spec is empty"});
  // Nesting far past any spec's: refused (yaml-cpp's own depth limit, or the schema), not a
  // stack overflow in loomd.
  cases.push_back({YamlRequest(std::string(100000, '[')), "job.yaml:"});
  cases.push_back(
      {YamlRequest("model: " + std::string(5000, '[') + std::string(5000, ']')), "job.yaml:"});
  cases.push_back({YamlRequest("name: x\n", "", "a\x1b[2Jb"), "spec_yaml.source:"});
  cases.push_back({YamlRequest("name: x\n", "", std::string(513, 'a')), "spec_yaml.source:"});
  cases.push_back({YamlRequest(std::string((1 << 20) + 1, '#')), "spec_yaml.text:"});
  v1::CreateJobRequest both = YamlRequest(kCpuSpecYaml);
  *both.mutable_spec() = CpuSpec(2);
  cases.push_back({both, "spec and spec_yaml are exclusive"});
  v1::CreateJobRequest relative = YamlRequest(kCpuSpecYaml);
  relative.mutable_spec_yaml()->set_base_dir("data/here");
  cases.push_back({relative, "spec_yaml.base_dir: must be an absolute directory"});
  for (const Case& c : cases) {
    const absl::Status refused = manager_->CreateJob(c.request).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_THAT(std::string(refused.message()), HasSubstr(c.expected));
  }
  EXPECT_EQ(JobCount(), 0);
}

// base_dir is where loomctl found the file: relative paths in it are resolved against it, and
// are then checked like any path a spec names.
TEST_F(JobManagerSpecTest, RelativePathsInYamlAreResolvedAgainstBaseDir) {
  Connect(CpuNode("n1", 2));
  v1::CreateJobRequest request = YamlRequest(
      "model: {preset: tiny}\ndata: {path: corpus/train.bin}\ntrain: {steps: 10}\n"
      "resources: {cpu_devices: 2}\ncheckpoint: {dir: ../ckpt}\n");
  request.mutable_spec_yaml()->set_base_dir("/srv/team/run1");
  absl::StatusOr<v1::Job> job = manager_->CreateJob(request);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().data().path(), "/srv/team/run1/corpus/train.bin");
  EXPECT_EQ(job->spec().checkpoint().dir(), "/srv/team/ckpt");
}

// "/" separates the tenant in the idempotency key: a default-tenant id "team-b/x" would be
// tenant team-b's key "x", and would find (or squat) that tenant's job.
TEST_F(JobManagerSpecTest, RequestIdWithTheTenantSeparatorIsRefused) {
  Connect(CpuNode("n1", 2));
  const absl::Status refused =
      manager_->CreateJob(CreateRequest(CpuSpec(2), "team-b/req-1")).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("request_id must not contain '/'"));
  EXPECT_EQ(JobCount(), 0);
}

// A default-tenant job stored before "/" was refused holds team-b's key: team-b's request with
// that id gets an error that names nothing of it, never that job.
TEST_F(JobManagerSpecTest, AKeyStoredForAnotherTenantIsNeverAnsweredWithItsJob) {
  Connect(CpuNode("n1", 2));
  v1::Job legacy;
  legacy.set_name("jobs/legacy-1");
  legacy.set_request_id("team-b/req-1");
  legacy.set_state(v1::QUEUED);
  *legacy.mutable_spec() = CpuSpec(2);
  v1::JobEvent created;
  created.set_to_state(v1::QUEUED);
  ASSERT_TRUE(store_->CreateJob(legacy, created).ok());
  const absl::Status taken =
      manager_->CreateJob(CreateRequest(CpuSpec(2), "req-1"), "team-b").status();
  EXPECT_EQ(taken.code(), absl::StatusCode::kAlreadyExists) << taken;
  EXPECT_THAT(std::string(taken.message()), HasSubstr("is already taken"));
  EXPECT_THAT(std::string(taken.message()), Not(HasSubstr("legacy")));
}

TEST_F(JobManagerSpecTest, RacingAttemptsOfOneRequestAllGetTheOneJob) {
  // The idempotency lookup runs outside the manager's lock, so attempts of one request can pass
  // it together; the store's unique index admits one and the others answer as retries.
  Connect(CpuNode("n1", 2));
  constexpr int kAttempts = 16;
  std::vector<absl::StatusOr<v1::Job>> results(kAttempts, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kAttempts; ++i) {
    threads.emplace_back(
        [&, i] { results[i] = manager_->CreateJob(CreateRequest(CpuSpec(2), "req-race")); });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  for (const absl::StatusOr<v1::Job>& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->name(), results[0]->name());
  }
  EXPECT_EQ(JobCount(), 1);
}

TEST_F(JobManagerSpecTest, JobsCreatedIntoAFullClusterStartWhenDevicesFree) {
  // A create that cannot fit skips the scheduling pass; it must still start, in order, once the
  // running job ends.
  const std::shared_ptr<FakeSink> sink = Connect(CpuNode("n1", 2));
  absl::StatusOr<v1::Job> first = manager_->CreateJob(CreateRequest(CpuSpec(2)));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(manager_->GetJob(first->name())->state(), v1::SCHEDULED);
  absl::StatusOr<v1::Job> second = manager_->CreateJob(CreateRequest(CpuSpec(2)));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->state(), v1::QUEUED);
  EXPECT_EQ(second->events_size(), 1);
  EXPECT_EQ(manager_->GetJob(second->name())->state(), v1::QUEUED);
  EXPECT_TRUE(manager_->CancelJob(first->name()).ok());
  EXPECT_EQ(manager_->GetJob(second->name())->state(), v1::SCHEDULED);
}

TEST_F(JobManagerSpecTest, AModelThatFitsNoDeviceIsRefusedNamingTheMemoryNeeded) {
  Connect(GpuNode("g1", 8));
  for (const bool auto_layout : {true, false}) {
    v1::JobSpec spec = HugeGpuSpec(8);
    if (!auto_layout) {
      spec.mutable_parallelism()->set_data(8);
      spec.mutable_parallelism()->set_micro_batch(1);
    }
    const absl::Status s = manager_->CreateJob(CreateRequest(spec)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("spec.resources.gpus"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("GiB per GPU"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("ask for more devices")) << s;
  }
  EXPECT_EQ(JobCount(), 0);
  // A model that fits is still accepted.
  v1::JobSpec small = HugeGpuSpec(1);
  small.clear_model();
  small.mutable_model()->set_preset("gpt2-124m");
  absl::StatusOr<v1::Job> fits = manager_->CreateJob(CreateRequest(small));
  EXPECT_TRUE(fits.ok()) << fits.status();
}

TEST_F(JobManagerSpecTest, ShardedCheckpointsWithoutASharedDirStayOnOneNode) {
  auto n1 = Connect(CpuNode("n1", 2));
  // One device of n1 busy; n2 has one: two free devices, but on two nodes.
  ASSERT_TRUE(manager_->CreateJob(CreateRequest(CpuSpec(1))).ok());
  auto n2 = Connect(CpuNode("n2", 1));
  v1::JobSpec pipeline = CpuSpec(2);
  pipeline.mutable_parallelism()->set_pipeline(2);
  absl::StatusOr<v1::Job> local = manager_->CreateJob(CreateRequest(pipeline));
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->state(), v1::QUEUED);  // waits for one node rather than spreading

  pipeline.mutable_checkpoint()->set_dir("/shared/ckpt");
  absl::StatusOr<v1::Job> shared = manager_->CreateJob(CreateRequest(pipeline));
  ASSERT_TRUE(shared.ok()) << shared.status();
  // Behind the first in the queue (no backfill); it would spread once placed.
  EXPECT_EQ(PlacementGroup(shared->spec(), shared->layout()), 1);
  EXPECT_EQ(PlacementGroup(local->spec(), local->layout()), 2);

  // More ranks than any node holds, with node-local checkpoints: refused at create.
  v1::JobSpec wide = CpuSpec(3);  // 3 devices ready in all, at most 2 on one node
  wide.mutable_parallelism()->set_data(3);
  wide.mutable_parallelism()->set_zero1(true);
  const absl::Status refused = manager_->CreateJob(CreateRequest(wide)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("spec.checkpoint.dir"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("at most 2 devices per ready node"));
  wide.mutable_checkpoint()->set_dir("/shared/ckpt");
  EXPECT_TRUE(manager_->CreateJob(CreateRequest(wide)).ok());

  // Data parallelism alone with periodic checkpoints: rank 0's node alone would hold them and
  // a restart would find the ranks disagreeing (exit 2), so the same rule applies.
  v1::JobSpec dp = CpuSpec(3);
  dp.mutable_parallelism()->set_data(3);
  dp.mutable_checkpoint()->set_every_steps(5);
  const absl::Status dp_refused = manager_->CreateJob(CreateRequest(dp)).status();
  EXPECT_EQ(dp_refused.code(), absl::StatusCode::kFailedPrecondition) << dp_refused;
  EXPECT_THAT(std::string(dp_refused.message()),
              HasSubstr("resumes every rank from the periodic checkpoint rank 0 writes"));
  // Without periodic checkpoints nothing is resumed from, and the ranks may spread.
  dp.mutable_checkpoint()->set_every_steps(0);
  absl::StatusOr<v1::Job> no_periodic = manager_->CreateJob(CreateRequest(dp));
  ASSERT_TRUE(no_periodic.ok()) << no_periodic.status();
  EXPECT_EQ(PlacementGroup(no_periodic->spec(), no_periodic->layout()), 1);
}

TEST_F(JobManagerSpecTest, ARestartThatLostTheLastCheckpointSaysSo) {
  auto sink = Connect(CpuNode("n1", 1));
  v1::JobSpec spec = CpuSpec(1, /*max_restarts=*/1, 1.0);
  spec.mutable_train()->set_steps(100);
  spec.mutable_checkpoint()->set_every_steps(10);
  absl::StatusOr<v1::Job> job = manager_->CreateJob(CreateRequest(spec));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string name = job->name();
  Send("n1", RankPhase(name, 1, 0, v1::RANK_PHASE_RUNNING));
  for (int step = 1; step <= 25; ++step) Send("n1", Step(name, 1, 0, step, 100, 3.0));
  Send("n1", RankExit(name, 1, 0, v1::EXIT_CLASS_RETRYABLE, "killed by signal 9 (SIGKILL)"));
  clock_.Advance(absl::Seconds(2));
  manager_->Tick();
  ASSERT_EQ(manager_->GetJob(name)->generation(), 2);
  // Generation 2 starts from scratch: the checkpoint of step 20 was not where it looked.
  Send("n1", Step(name, 2, 0, 1, 100, 3.0));
  EXPECT_THAT(Reasons(name),
              Contains(HasSubstr("generation 2 started from step 0 (earlier generations reached "
                                 "step 25): the checkpoint of step 20 was NOT found")));
  EXPECT_THAT(Reasons(name), Contains(HasSubstr("set spec.checkpoint.dir")));
}

TEST(ResumeNoticeTest, SaysWhereAGangResumed) {
  v1::JobSpec spec;
  spec.mutable_checkpoint()->set_every_steps(10);
  EXPECT_FALSE(ResumeNotice(spec, 1, 1, 0).has_value());    // first generation
  EXPECT_FALSE(ResumeNotice(spec, 2, 26, 25).has_value());  // nothing lost
  EXPECT_THAT(ResumeNotice(spec, 2, 21, 25).value(),
              HasSubstr("resumed from the checkpoint of step 20"));
  // Step 20 reached but maybe not yet committed: resuming from 10 is not a lost checkpoint.
  EXPECT_THAT(ResumeNotice(spec, 2, 11, 20).value(), HasSubstr("resumed from the checkpoint"));
  spec.mutable_checkpoint()->set_every_steps(0);
  EXPECT_THAT(ResumeNotice(spec, 2, 1, 25).value(), HasSubstr("checkpoint.every_steps is 0"));
  EXPECT_EQ(CommittedCheckpointStep(25, 10), 20);
  EXPECT_EQ(CommittedCheckpointStep(20, 10), 10);
  EXPECT_EQ(CommittedCheckpointStep(5, 0), 0);
}

}  // namespace
}  // namespace loom::jobs
