// Durability of CreateJob under group commit: a real loomd is killed with SIGKILL in the middle
// of a storm of concurrent creates (many share one SQLite transaction), restarted on the same
// state dir, and every job whose CreateJob was acknowledged must be there, with its request id.
// Requests that were in flight at the kill may or may not exist; a retry of one must give back
// a single job either way.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "loom/v1/job.grpc.pb.h"
#include "loom/v1/node.grpc.pb.h"
#include "tests/integration/cluster.h"

namespace loom::testing {
namespace {

v1::JobSpec StormSpec() {
  v1::JobSpec spec;
  spec.set_name("storm");
  spec.mutable_model()->set_preset("tiny");
  spec.mutable_data()->set_builtin("tiny-corpus");
  spec.mutable_train()->set_steps(1);
  spec.mutable_resources()->set_cpu_devices(1);
  return spec;
}

void RegisterFakeNode(Cluster& cluster) {
  grpc::ClientContext context;
  v1::RegisterNodeRequest request;
  request.set_node_id("storm-node");
  request.set_hostname("localhost");
  for (int i = 0; i < 8; ++i) {
    v1::Device* d = request.add_devices();
    d->set_kind(v1::DEVICE_KIND_CPU);
    d->set_index(i);
    d->set_model("cpu");
  }
  v1::RegisterNodeResponse response;
  const grpc::Status s = cluster.nodes().RegisterNode(&context, request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
}

TEST(CreateStormKillTest, EveryAcknowledgedJobSurvivesAKillNineMidStorm) {
  ClusterOptions options;
  options.workers = 0;
  options.secure = false;
  // The fake node never opens a session; it must stay READY across the restart.
  options.node_timeout_ms = 600'000;
  options.heartbeat_interval_ms = 100'000;
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok()) << cluster.LogTails();
  RegisterFakeNode(cluster);
  const std::string address = cluster.loomd_address();

  constexpr int kClients = 16;
  constexpr int kAcknowledgedBeforeKill = 400;
  std::mutex mu;
  std::map<std::string, std::string> acknowledged;  // request id -> job name
  std::vector<std::string> in_flight_at_kill;       // request ids whose call failed
  std::atomic<int> acks{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      grpc::ChannelArguments args;
      args.SetInt("grpc.use_local_subchannel_pool", 1);
      auto stub = v1::JobService::NewStub(
          grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
      for (int i = 0;; ++i) {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        v1::CreateJobRequest request;
        *request.mutable_spec() = StormSpec();
        request.set_request_id(absl::StrCat("storm-", c, "-", i));
        v1::Job job;
        const grpc::Status s = stub->CreateJob(&context, request, &job);
        std::lock_guard<std::mutex> lock(mu);
        if (!s.ok()) {
          // loomd is gone: this request may or may not have been committed.
          in_flight_at_kill.push_back(request.request_id());
          return;
        }
        acknowledged[request.request_id()] = job.name();
        acks.fetch_add(1);
      }
    });
  }
  ASSERT_TRUE(WaitFor([&] { return acks.load() >= kAcknowledgedBeforeKill; }, absl::Seconds(60)))
      << acks.load() << " creates acknowledged\n"
      << cluster.LogTails();
  cluster.loomd().Kill();  // SIGKILL, while the clients keep creating
  for (std::thread& t : clients) t.join();
  ASSERT_EQ(in_flight_at_kill.size(), static_cast<size_t>(kClients));

  ASSERT_TRUE(cluster.StartLoomd(0).ok()) << cluster.LogTails();
  for (const auto& [request_id, name] : acknowledged) {
    absl::StatusOr<v1::Job> job = cluster.GetJob(name);
    ASSERT_TRUE(job.ok()) << "acknowledged " << name << " (" << request_id
                          << ") is lost after kill -9: " << job.status();
    EXPECT_EQ(job->request_id(), request_id);
    EXPECT_EQ(job->state(), v1::QUEUED);
  }
  // A retry of a request cut off by the kill gets one job: the committed one, or a new one.
  for (const std::string& request_id : in_flight_at_kill) {
    std::string first_name;
    for (int attempt = 0; attempt < 2; ++attempt) {
      grpc::ClientContext context;
      v1::CreateJobRequest request;
      *request.mutable_spec() = StormSpec();
      request.set_request_id(request_id);
      v1::Job job;
      const grpc::Status s = cluster.jobs().CreateJob(&context, request, &job);
      ASSERT_TRUE(s.ok()) << request_id << ": " << s.error_message();
      if (attempt == 0) first_name = job.name();
      EXPECT_EQ(job.name(), first_name) << request_id;
    }
  }
  // Every job in the store: the acknowledged ones plus at most the in-flight ones (+ retries).
  int listed = 0;
  std::string token;
  do {
    grpc::ClientContext context;
    v1::ListJobsRequest request;
    request.set_page_size(1000);
    request.set_page_token(token);
    v1::ListJobsResponse response;
    const grpc::Status s = cluster.jobs().ListJobs(&context, request, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    listed += response.jobs_size();
    token = response.next_page_token();
  } while (!token.empty());
  EXPECT_EQ(static_cast<size_t>(listed), acknowledged.size() + in_flight_at_kill.size());
}

}  // namespace
}  // namespace loom::testing
