// CreateJob throughput and latency: C concurrent clients (default 32), each on its own
// channel, each sending R CreateJob requests (default 100) back to back, against one loomd
// started on port 0 with a temp state dir (SQLite, WAL). One fake node with 8 CPU devices is
// registered first so that jobs pass validation (it never opens a session; loomd runs with a
// long node timeout so it stays READY). Prints one table; figures go to docs/benchmarks.md.
//
//   createjob_bench [--clients=32] [--requests=100]
//
// Plain main, not a timed test: the numbers depend on the machine and on its load.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "loom/v1/job.grpc.pb.h"
#include "loom/v1/node.grpc.pb.h"
#include "tests/integration/cluster.h"

namespace {

int FlagValue(int argc, char** argv, const char* name, int fallback) {
  const std::string prefix = absl::StrCat("--", name, "=");
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      return std::atoi(argv[i] + prefix.size());
    }
  }
  return fallback;
}

loom::v1::JobSpec BenchSpec() {
  loom::v1::JobSpec spec;
  spec.set_name("bench");
  spec.mutable_model()->set_preset("tiny");
  spec.mutable_data()->set_builtin("tiny-corpus");
  spec.mutable_train()->set_steps(1);
  spec.mutable_resources()->set_cpu_devices(1);
  return spec;
}

double Percentile(std::vector<double> sorted_ms, double p) {
  if (sorted_ms.empty()) return 0;
  const size_t i = std::min(sorted_ms.size() - 1,
                            static_cast<size_t>(p * static_cast<double>(sorted_ms.size())));
  return sorted_ms[i];
}

}  // namespace

int main(int argc, char** argv) {
  const int clients = FlagValue(argc, argv, "clients", 32);
  const int requests = FlagValue(argc, argv, "requests", 100);

  loom::testing::ClusterOptions options;
  options.workers = 0;
  options.node_timeout_ms = 3'600'000;
  options.heartbeat_interval_ms = 1'000'000;
  // Plaintext and unauthenticated, as the figures in docs/benchmarks.md were taken; TLS and
  // token checks are not measured here.
  options.secure = false;
  loom::testing::Cluster cluster(options);
  if (absl::Status s = cluster.Start(); !s.ok()) {
    std::cerr << "createjob_bench: cannot start loomd: " << s << std::endl;
    return 1;
  }

  {
    grpc::ClientContext context;
    loom::v1::RegisterNodeRequest request;
    request.set_node_id("bench-node");
    request.set_hostname("localhost");
    for (int i = 0; i < 8; ++i) {
      loom::v1::Device* d = request.add_devices();
      d->set_kind(loom::v1::DEVICE_KIND_CPU);
      d->set_index(i);
      d->set_model("cpu");
    }
    loom::v1::RegisterNodeResponse response;
    const grpc::Status s = cluster.nodes().RegisterNode(&context, request, &response);
    if (!s.ok()) {
      std::cerr << "createjob_bench: RegisterNode: " << s.error_message() << std::endl;
      return 1;
    }
  }
  {
    // One request first: it must succeed, or every figure below would measure errors.
    grpc::ClientContext context;
    loom::v1::CreateJobRequest request;
    *request.mutable_spec() = BenchSpec();
    request.set_request_id("bench-warmup");
    loom::v1::Job job;
    const grpc::Status s = cluster.jobs().CreateJob(&context, request, &job);
    if (!s.ok()) {
      std::cerr << "createjob_bench: CreateJob is rejected: " << s.error_message() << std::endl;
      return 1;
    }
  }

  std::vector<std::vector<double>> latencies(clients);
  std::atomic<int> errors{0};
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      grpc::ChannelArguments args;
      args.SetInt("grpc.use_local_subchannel_pool", 1);  // one connection per client
      auto channel = grpc::CreateCustomChannel(cluster.loomd_address(),
                                               grpc::InsecureChannelCredentials(), args);
      auto stub = loom::v1::JobService::NewStub(channel);
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
      const loom::v1::JobSpec spec = BenchSpec();
      latencies[c].reserve(requests);
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < requests; ++i) {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        loom::v1::CreateJobRequest request;
        *request.mutable_spec() = spec;
        request.set_request_id(absl::StrCat("bench-", c, "-", i));
        loom::v1::Job job;
        const auto start = std::chrono::steady_clock::now();
        const grpc::Status s = stub->CreateJob(&context, request, &job);
        const auto end = std::chrono::steady_clock::now();
        if (!s.ok()) {
          errors.fetch_add(1);
          continue;
        }
        latencies[c].push_back(std::chrono::duration<double, std::milli>(end - start).count());
      }
    });
  }
  while (ready.load() < clients) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  go.store(true);
  for (std::thread& t : threads) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<double> all;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  const int total = clients * requests;
  std::printf("CreateJob against one loomd (SQLite WAL, temp state dir), %u hardware threads\n",
              std::thread::hardware_concurrency());
  std::printf("%-8s %-9s %-7s %-8s %-9s %-8s %-8s %-8s %-8s\n", "clients", "requests", "errors",
              "seconds", "req/s", "p50 ms", "p90 ms", "p99 ms", "max ms");
  std::printf("%-8d %-9d %-7d %-8.2f %-9.0f %-8.2f %-8.2f %-8.2f %-8.2f\n", clients, total,
              errors.load(), seconds, static_cast<double>(all.size()) / seconds,
              Percentile(all, 0.50), Percentile(all, 0.90), Percentile(all, 0.99),
              all.empty() ? 0.0 : all.back());
  cluster.Shutdown();
  return errors.load() == 0 ? 0 : 1;
}
