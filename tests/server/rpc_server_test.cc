// The real gRPC server (LoomdServer) in process on port 0: JobService calls, a WatchJob stream,
// a worker Session stream, malformed and oversized requests, and the RPC metrics.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "loom/v1/job.grpc.pb.h"
#include "loom/v1/node.grpc.pb.h"
#include "loom/v1/rendezvous.grpc.pb.h"
#include "server/jobs/default_spec_validator.h"
#include "server/metrics/server_metrics.h"
#include "server/rpc/loomd_server.h"
#include "tests/server/loomd_test_util.h"
#include "tests/server/store_test_util.h"

namespace loom::rpc {
namespace {

using ::loom::testing::CpuNode;
using ::loom::testing::CpuSpec;
using ::testing::HasSubstr;

class RpcServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LoomdConfig config;
    config.listen = "127.0.0.1:0";
    config.metrics_listen = "127.0.0.1:0";
    config.state_dir = dir_.File("state");
    config.insecure = true;  // loopback development mode; tests/server/security_test.cc has TLS
    absl::StatusOr<std::unique_ptr<LoomdServer>> server =
        LoomdServer::Start(config, &clock_, jobs::MakeSpecValidator());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel_);
    nodes_ = v1::NodeService::NewStub(channel_);
    rendezvous_ = v1::RendezvousService::NewStub(channel_);
  }

  void RegisterNode(const std::string& id, int devices) {
    grpc::ClientContext context;
    v1::RegisterNodeResponse response;
    grpc::Status status = nodes_->RegisterNode(&context, CpuNode(id, devices), &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.heartbeat_interval_ms(), 1000);
  }

  grpc::Status Create(const v1::CreateJobRequest& request, v1::Job* job) {
    grpc::ClientContext context;
    return jobs_->CreateJob(&context, request, job);
  }

  store::testing::TempDir dir_;
  SystemClock clock_;
  std::unique_ptr<LoomdServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::NodeService::Stub> nodes_;
  std::unique_ptr<v1::RendezvousService::Stub> rendezvous_;
};

TEST_F(RpcServerTest, CreateGetListWatchAndCancel) {
  RegisterNode("n1", 2);  // capacity, but no session: the job stays QUEUED
  v1::Job created;
  grpc::Status status = Create(::loom::testing::CreateRequest(CpuSpec(2), "req-7"), &created);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(created.state(), v1::QUEUED);
  v1::Job again;
  ASSERT_TRUE(Create(::loom::testing::CreateRequest(CpuSpec(2), "req-7"), &again).ok());
  EXPECT_EQ(again.name(), created.name());

  {
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_name(created.name());
    v1::Job job;
    ASSERT_TRUE(jobs_->GetJob(&context, request, &job).ok());
    EXPECT_EQ(job.events_size(), 1);
    EXPECT_EQ(job.spec().train().steps(), 10);
  }
  {
    grpc::ClientContext context;
    v1::ListJobsResponse response;
    ASSERT_TRUE(jobs_->ListJobs(&context, v1::ListJobsRequest(), &response).ok());
    ASSERT_EQ(response.jobs_size(), 1);
    EXPECT_TRUE(response.next_page_token().empty());
  }

  grpc::ClientContext watch_context;
  v1::WatchJobRequest watch_request;
  watch_request.set_name(created.name());
  std::unique_ptr<grpc::ClientReader<v1::JobUpdate>> watch =
      jobs_->WatchJob(&watch_context, watch_request);
  v1::JobUpdate update;
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.job().state(), v1::QUEUED);

  {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_name(created.name());
    v1::Job job;
    ASSERT_TRUE(jobs_->CancelJob(&context, request, &job).ok());
    EXPECT_EQ(job.state(), v1::CANCELLED);
  }
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.job().state(), v1::CANCELLED);
  EXPECT_FALSE(watch->Read(&update));  // the stream ends after a terminal state
  EXPECT_TRUE(watch->Finish().ok());

  // Logs of a finished job: an empty, finite stream even with follow.
  grpc::ClientContext logs_context;
  v1::StreamJobLogsRequest logs_request;
  logs_request.set_name(created.name());
  logs_request.set_follow(true);
  auto logs = jobs_->StreamJobLogs(&logs_context, logs_request);
  v1::LogLine line;
  EXPECT_FALSE(logs->Read(&line));
  EXPECT_TRUE(logs->Finish().ok());

  // Every call's duration on loomd, by method: the two creates, and the streams once they ended.
  const std::string text = server_->registry()->Serialize();
  EXPECT_THAT(text, HasSubstr("loom_rpc_duration_seconds_count{method=\"/loom.v1.JobService/"
                              "CreateJob\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("loom_rpc_duration_seconds_count{method=\"/loom.v1.JobService/"
                              "WatchJob\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("loom_rpc_duration_seconds_count{method=\"/loom.v1.JobService/"
                              "StreamJobLogs\"} 1\n"));
}

// A client chooses the path it calls: a made-up method is counted as "other", so that no caller
// can add series to loomd's registry; the methods loomd serves, health checks included, keep
// their names.
TEST_F(RpcServerTest, AMadeUpMethodIsCountedAsOther) {
  grpc::GenericStub stub(channel_);
  grpc::CompletionQueue cq;
  for (const std::string path : {"/loom.v1.Bogus0/X", "/loom.v1.JobService/Bogus1", "/grpc.x/Y"}) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::ByteBuffer request, response;
    std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
        stub.PrepareUnaryCall(&context, path, request, &cq);
    call->StartCall();
    grpc::Status status;
    call->Finish(&response, &status, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    ASSERT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << path;
  }
  const std::string text = server_->registry()->Serialize();
  EXPECT_THAT(text,
              HasSubstr("loom_rpc_requests_total{code=\"UNIMPLEMENTED\",method=\"other\"} 3\n"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("Bogus")));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("grpc.x")));
  // A method loomd serves keeps its name.
  v1::Job job;
  grpc::ClientContext get_context;
  v1::GetJobRequest get;
  get.set_name("jobs/none");
  EXPECT_EQ(jobs_->GetJob(&get_context, get, &job).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(server_->registry()->Serialize(),
              HasSubstr("loom_rpc_requests_total{code=\"NOT_FOUND\",method=\"/loom.v1.JobService/"
                        "GetJob\"} 1\n"));
  cq.Shutdown();
}

// The histogram's buckets, with durations known: 3 ms falls in (2 ms, 4 ms]; a duration from a
// clock stepped backwards counts as zero; each method has its own series; codes stay bounded.
TEST(ServerMetricsTest, RpcDurationsFallInTheirMethodsBuckets) {
  metrics::Registry registry;
  server_metrics::ServerMetrics metrics(&registry);
  const std::string create = "/loom.v1.JobService/CreateJob";
  metrics.RecordRpc(create, grpc::StatusCode::OK, absl::Milliseconds(3));
  metrics.RecordRpc(create, grpc::StatusCode::INVALID_ARGUMENT, absl::Seconds(-2));
  metrics.RecordRpc("/loom.v1.JobService/WatchJob", grpc::StatusCode::OK, absl::Hours(1));
  metrics.RecordRpc("/loom.v1.JobService/WatchJob", 99, absl::Seconds(20));
  const std::string text = registry.Serialize();
  const std::string series = "loom_rpc_duration_seconds_bucket{method=\"" + create + "\",le=";
  EXPECT_THAT(text, HasSubstr(series + "\"0.00025\"} 1\n"));  // the clamped one
  EXPECT_THAT(text, HasSubstr(series + "\"0.002\"} 1\n"));
  EXPECT_THAT(text, HasSubstr(series + "\"0.004\"} 2\n"));
  EXPECT_THAT(text, HasSubstr(series + "\"+Inf\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("loom_rpc_duration_seconds_sum{method=\"" + create + "\"} 0.003\n"));
  EXPECT_THAT(text, HasSubstr("loom_rpc_duration_seconds_bucket{method=\"/loom.v1.JobService/"
                              "WatchJob\",le=\"16.384\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("loom_rpc_duration_seconds_count{method=\"/loom.v1.JobService/"
                              "WatchJob\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("loom_rpc_requests_total{code=\"INVALID_ARGUMENT\",method=\"" +
                              create + "\"} 1\n"));
  // A number that is not a gRPC code is counted as UNKNOWN (bounded label values).
  EXPECT_THAT(text, HasSubstr("loom_rpc_requests_total{code=\"UNKNOWN\",method=\"/loom.v1."
                              "JobService/WatchJob\"} 1\n"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("code=\"99\"")));
}

TEST_F(RpcServerTest, MalformedRequestsGetCodesThatNameTheField) {
  RegisterNode("n1", 2);
  struct Case {
    std::string name;
    grpc::StatusCode code;
    std::string field;
  };
  for (const Case& c : std::vector<Case>{
           {"foo", grpc::StatusCode::INVALID_ARGUMENT, "name must look like jobs/{job}"},
           {"jobs/", grpc::StatusCode::INVALID_ARGUMENT, "name must look like jobs/{job}"},
           {"jobs/no-such-job", grpc::StatusCode::NOT_FOUND, "jobs/no-such-job"}}) {
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_name(c.name);
    v1::Job job;
    grpc::Status status = jobs_->GetJob(&context, request, &job);
    EXPECT_EQ(status.error_code(), c.code) << c.name;
    EXPECT_THAT(status.error_message(), HasSubstr(c.field));
  }
  {
    grpc::ClientContext context;
    v1::ListJobsRequest request;
    request.set_page_token("garbage!");
    v1::ListJobsResponse response;
    grpc::Status status = jobs_->ListJobs(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("page_token"));
  }
  v1::Job job;
  grpc::Status status = Create(v1::CreateJobRequest(), &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("spec"));
  v1::JobSpec no_devices = CpuSpec(0);
  status = Create(::loom::testing::CreateRequest(no_devices), &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("resources"));
  status = Create(::loom::testing::CreateRequest(CpuSpec(16)), &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  {
    grpc::ClientContext context;
    v1::RegisterNodeResponse response;
    status = nodes_->RegisterNode(&context, CpuNode("Bad!", 1), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("node_id"));
  }
  {
    grpc::ClientContext context;
    v1::GetRequest request;
    request.mutable_scope()->set_job("jobs/nope");
    request.mutable_scope()->set_generation(1);
    request.set_key("k");
    v1::GetResponse response;
    // Without the gang's secret nothing is said about the scope, not even whether it exists.
    status = rendezvous_->Get(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(status.error_message(), HasSubstr("LOOM_RENDEZVOUS_SECRET"));
  }
  // Nothing was written.
  grpc::ClientContext context;
  v1::ListJobsResponse response;
  ASSERT_TRUE(jobs_->ListJobs(&context, v1::ListJobsRequest(), &response).ok());
  EXPECT_EQ(response.jobs_size(), 0);

  // Every call was counted by method and code.
  const std::string text = server_->registry()->Serialize();
  EXPECT_THAT(text, HasSubstr("loom_rpc_requests_total{code=\"INVALID_ARGUMENT\","
                              "method=\"/loom.v1.JobService/GetJob\"}"));
  EXPECT_THAT(text, HasSubstr("method=\"/loom.v1.NodeService/RegisterNode\""));
  EXPECT_THAT(text, HasSubstr("loom_jobs{state=\"QUEUED\"} 0"));
  EXPECT_THAT(text, HasSubstr("loom_devices{kind=\"cpu\",state=\"total\"} 2"));
}

TEST_F(RpcServerTest, OversizedMessagesAreRejectedNotFatal) {
  RegisterNode("n1", 2);
  v1::CreateJobRequest request = ::loom::testing::CreateRequest(CpuSpec(2));
  (*request.mutable_spec()->mutable_env())["HUGE"] = std::string(5 << 20, 'x');
  v1::Job job;
  grpc::Status status = Create(request, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // The server still serves.
  ASSERT_TRUE(Create(::loom::testing::CreateRequest(CpuSpec(2)), &job).ok());
}

TEST_F(RpcServerTest, SessionReceivesAssignmentsAndHeartbeats) {
  RegisterNode("n1", 2);
  grpc::ClientContext context;
  auto session = nodes_->Session(&context);
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_node_id("n1");
  ASSERT_TRUE(session->Write(hello));
  ASSERT_TRUE(session->Write(::loom::testing::Heartbeat()));

  v1::Job job;
  // The session may not be open yet when CreateJob runs; either way the job gets placed.
  ASSERT_TRUE(Create(::loom::testing::CreateRequest(CpuSpec(2)), &job).ok());
  v1::CoordinatorMessage message;
  ASSERT_TRUE(session->Read(&message));
  ASSERT_TRUE(message.has_assign());
  EXPECT_EQ(message.assign().job(), job.name());
  EXPECT_EQ(message.assign().generation(), 1);
  EXPECT_EQ(message.assign().rendezvous_address(), server_->grpc_address());
  EXPECT_EQ(message.assign().ranks_size(), 2);

  // Rendezvous works for the scheduled generation with the assignment's secret, and only for it.
  const std::string secret = message.assign().rendezvous_secret();
  EXPECT_EQ(secret.size(), 64u);
  {
    grpc::ClientContext set_context;
    set_context.AddMetadata(kRendezvousSecretHeader, secret);
    v1::SetRequest set;
    set.mutable_scope()->set_job(job.name());
    set.mutable_scope()->set_generation(1);
    set.set_key("nccl");
    set.set_value("id");
    v1::SetResponse set_response;
    EXPECT_TRUE(rendezvous_->Set(&set_context, set, &set_response).ok());
    grpc::ClientContext wait_context;
    wait_context.AddMetadata(kRendezvousSecretHeader, secret);
    v1::WaitRequest wait;
    *wait.mutable_scope() = set.scope();
    wait.add_keys("nccl");
    v1::WaitResponse wait_response;
    ASSERT_TRUE(rendezvous_->Wait(&wait_context, wait, &wait_response).ok());
    EXPECT_EQ(wait_response.values(0), "id");
    // Generation 1's secret does not open generation 2's scope.
    grpc::ClientContext stale_context;
    stale_context.AddMetadata(kRendezvousSecretHeader, secret);
    set.mutable_scope()->set_generation(2);
    EXPECT_EQ(rendezvous_->Set(&stale_context, set, &set_response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }

  // Logs forwarded on the session reach a follower (rank filter applied); the follow stream
  // ends once the job is terminal and every line has been sent.
  grpc::ClientContext logs_context;
  v1::StreamJobLogsRequest logs_request;
  logs_request.set_name(job.name());
  logs_request.set_follow(true);
  logs_request.set_rank(1);
  auto logs = jobs_->StreamJobLogs(&logs_context, logs_request);
  for (int rank : {0, 1}) {
    v1::WorkerMessage chunk;
    chunk.mutable_logs()->set_job(job.name());
    chunk.mutable_logs()->set_generation(1);
    chunk.mutable_logs()->set_rank(rank);
    chunk.mutable_logs()->set_stream("stdout");
    chunk.mutable_logs()->add_lines("hello from rank " + std::to_string(rank));
    ASSERT_TRUE(session->Write(chunk));
  }
  v1::LogLine line;
  ASSERT_TRUE(logs->Read(&line));
  EXPECT_EQ(line.rank(), 1);
  EXPECT_EQ(line.text(), "hello from rank 1");
  EXPECT_EQ(line.node(), "nodes/n1");
  {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_name(job.name());
    v1::Job cancelled;
    ASSERT_TRUE(jobs_->CancelJob(&context, request, &cancelled).ok());
  }
  EXPECT_FALSE(logs->Read(&line));
  EXPECT_TRUE(logs->Finish().ok());
  ASSERT_TRUE(session->Read(&message));
  EXPECT_TRUE(message.has_cancel());

  // A second session for the same node replaces the first.
  grpc::ClientContext context2;
  auto session2 = nodes_->Session(&context2);
  ASSERT_TRUE(session2->Write(hello));
  EXPECT_FALSE(session->Read(&message));
  grpc::Status ended = session->Finish();
  EXPECT_FALSE(ended.ok());
  session2->WritesDone();
  context2.TryCancel();
  session2->Finish();
}

TEST_F(RpcServerTest, ShutdownIsPromptWithClientsConnected) {
  RegisterNode("n1", 2);  // the channel now holds an open connection
  grpc::ClientContext context;
  auto session = nodes_->Session(&context);  // and an open session stream
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_node_id("n1");
  ASSERT_TRUE(session->Write(hello));
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  server_->Shutdown();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  v1::CoordinatorMessage message;
  EXPECT_FALSE(session->Read(&message));
  session->Finish();
}

TEST_F(RpcServerTest, SessionMustStartWithHelloOfARegisteredNode) {
  {
    grpc::ClientContext context;
    auto session = nodes_->Session(&context);
    ASSERT_TRUE(session->Write(::loom::testing::Heartbeat()));
    session->WritesDone();
    grpc::Status status = session->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("hello"));
  }
  grpc::ClientContext context;
  auto session = nodes_->Session(&context);
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_node_id("stranger");
  ASSERT_TRUE(session->Write(hello));
  session->WritesDone();
  grpc::Status status = session->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("RegisterNode"));
}

TEST_F(RpcServerTest, PlanJobRanksLayoutsOnTheLiveClusterOrADescribedOne) {
  RegisterNode("n1", 2);
  auto plan = [&](const v1::PlanJobRequest& request, v1::PlanJobResponse* response) {
    grpc::ClientContext context;
    return jobs_->PlanJob(&context, request, response);
  };
  {
    v1::PlanJobRequest request;
    *request.mutable_spec() = CpuSpec(2);
    v1::PlanJobResponse response;
    grpc::Status status = plan(request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_FALSE(response.plans().empty());
    EXPECT_THAT(response.devices(), HasSubstr("2 × cpu"));
    for (const v1::Plan& p : response.plans()) {
      EXPECT_EQ(p.layout().data() * p.layout().tensor() * p.layout().pipeline(), 2);
      EXPECT_GT(p.step_seconds(), 0);
    }
  }
  {
    // Planning ahead: a described cluster instead of the live one.
    v1::PlanJobRequest request;
    request.mutable_spec()->mutable_model()->set_preset("gpt2-124m");
    request.mutable_spec()->mutable_resources()->set_gpus(16);
    v1::ClusterDescription& cluster = *request.mutable_cluster();
    cluster.set_nodes(4);
    cluster.set_gpus_per_node(8);
    cluster.mutable_gpu()->set_model("A100-80GB");
    request.set_top_k(3);
    v1::PlanJobResponse response;
    grpc::Status status = plan(request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.plans_size(), 3);
    EXPECT_THAT(response.devices(), HasSubstr("16 × A100-80GB"));
  }
  {
    // Nothing fits: FAILED_PRECONDITION with the planner's alternative.
    v1::PlanJobRequest request;
    request.mutable_spec()->mutable_model()->set_preset("gpt-1t");
    request.mutable_spec()->mutable_resources()->set_gpus(8);
    request.mutable_cluster()->set_nodes(1);
    request.mutable_cluster()->set_gpus_per_node(8);
    request.mutable_cluster()->mutable_gpu()->set_model("H100-SXM");
    v1::PlanJobResponse response;
    grpc::Status status = plan(request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(status.error_message(), HasSubstr("needs at least"));
  }
  {
    v1::PlanJobResponse response;
    grpc::Status status = plan(v1::PlanJobRequest(), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("spec is required"));
  }
  {
    // The live cluster has no GPUs.
    v1::PlanJobRequest request;
    request.mutable_spec()->mutable_model()->set_preset("gpt2-124m");
    request.mutable_spec()->mutable_resources()->set_gpus(8);
    v1::PlanJobResponse response;
    grpc::Status status = plan(request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(status.error_message(), HasSubstr("--cluster"));
  }
  // PlanJob writes nothing.
  grpc::ClientContext context;
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(jobs_->ListJobs(&context, v1::ListJobsRequest(), &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 0);
}

// tiny on 2 CPU devices: the planner (free to choose tp and pp) picks plain data parallelism.
TEST_F(RpcServerTest, CreateJobWithAutoStoresThePlannersLayout) {
  RegisterNode("n1", 2);
  v1::JobSpec spec = CpuSpec(2);
  spec.mutable_parallelism()->mutable_auto_();
  v1::Job job;
  grpc::Status status = Create(::loom::testing::CreateRequest(spec), &job);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(job.has_plan()) << job.DebugString();
  const v1::Layout& planned = job.plan().layout();
  EXPECT_EQ(planned.tensor(), 1);
  EXPECT_EQ(planned.pipeline(), 1);
  EXPECT_EQ(planned.data(), 2);
  EXPECT_EQ(planned.recompute(), "none");
  EXPECT_FALSE(planned.zero1());
  EXPECT_GT(job.plan().step_seconds(), 0);
  EXPECT_THAT(job.plan().reasons(), ::testing::Contains(HasSubstr("auto keeps recompute none")));
  // The job runs the plan's micro-batching, consistent with its global batch.
  EXPECT_EQ(job.layout().tensor(), 1);
  EXPECT_EQ(job.layout().data(), 2);
  EXPECT_EQ(job.layout().micro_batch(), planned.micro_batch());
  EXPECT_EQ(job.layout().num_micro_batches(), planned.num_micro_batches());
  EXPECT_EQ(job.spec().parallelism().micro_batch(), planned.micro_batch());
  EXPECT_EQ(int64_t{job.layout().data()} * job.layout().micro_batch() *
                job.layout().num_micro_batches() * job.spec().train().seq_len(),
            job.spec().train().global_batch_tokens());
}

TEST_F(RpcServerTest, CreateJobKeepsTheDefaultLayoutWhenThePlannerCannotPlan) {
  // 3 CPU devices over nodes of 2 and 1: not a whole number of nodes for the planner, but a
  // valid job today, so it is created with the default layout and the reason recorded.
  RegisterNode("n1", 2);
  RegisterNode("n2", 1);
  v1::Job job;
  grpc::Status status = Create(::loom::testing::CreateRequest(CpuSpec(3)), &job);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_FALSE(job.has_plan());
  EXPECT_EQ(job.layout().data(), 3);
  EXPECT_EQ(job.layout().tensor(), 1);
  ASSERT_GE(job.events_size(), 1);
  EXPECT_THAT(job.events(0).reason(), HasSubstr("planner not used"));
}

}  // namespace
}  // namespace loom::rpc
