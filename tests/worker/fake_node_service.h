// FakeNodeService: an in-process NodeService for worker tests. It records registrations and
// every WorkerMessage, and lets a test send CoordinatorMessages down the open session.
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "loom/v1/node.grpc.pb.h"

namespace loom::worker::testing {

class FakeNodeService final : public v1::NodeService::Service {
 public:
  // What RegisterNode answers in accepts_rank_status_batches: false plays an older loomd.
  std::atomic<bool> accept_batches{false};

  grpc::Status RegisterNode(grpc::ServerContext*, const v1::RegisterNodeRequest* request,
                            v1::RegisterNodeResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    registrations_.push_back(*request);
    response->mutable_node()->set_name("nodes/" + request->node_id());
    response->set_heartbeat_interval_ms(100);
    response->set_accepts_rank_status_batches(accept_batches.load());
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Session(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) override {
    std::atomic<bool> done{false};
    std::thread writer([&] {
      while (!done.load()) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::milliseconds(20));
        while (!outgoing_.empty()) {
          v1::CoordinatorMessage m = outgoing_.front();
          outgoing_.pop_front();
          lock.unlock();
          stream->Write(m);
          lock.lock();
        }
      }
    });
    v1::WorkerMessage m;
    while (stream->Read(&m)) {
      std::lock_guard<std::mutex> lock(mu_);
      received_.push_back(m);
      cv_.notify_all();
    }
    done.store(true);
    writer.join();
    return grpc::Status::OK;
  }

  void Send(v1::CoordinatorMessage m) {
    std::lock_guard<std::mutex> lock(mu_);
    outgoing_.push_back(std::move(m));
    cv_.notify_all();
  }

  // Waits until `pred(registrations, received)` holds.
  bool WaitFor(const std::function<bool(const std::vector<v1::RegisterNodeRequest>&,
                                        const std::vector<v1::WorkerMessage>&)>& pred,
               absl::Duration timeout = absl::Seconds(20)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                        [&] { return pred(registrations_, received_); });
  }

  std::vector<v1::WorkerMessage> Received() {
    std::lock_guard<std::mutex> lock(mu_);
    return received_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::RegisterNodeRequest> registrations_;
  std::vector<v1::WorkerMessage> received_;
  std::deque<v1::CoordinatorMessage> outgoing_;
};

struct FakeServer {
  FakeNodeService service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;

  // Binds 127.0.0.1:`want_port` (0: any free port).
  bool Start(int want_port) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", want_port),
                             grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    return server != nullptr && port > 0;
  }
  void Stop() {
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
    server->Wait();
    server.reset();
  }
};

inline int CountKind(const std::vector<v1::WorkerMessage>& ms, v1::WorkerMessage::MsgCase kind) {
  int n = 0;
  for (const auto& m : ms) n += m.msg_case() == kind;
  return n;
}

// The first status of (job, phase[, rank]), sent alone or in a batch.
inline const v1::RankStatus* FindStatus(const std::vector<v1::WorkerMessage>& ms,
                                        const std::string& job, v1::RankPhase phase,
                                        int rank = -1) {
  auto matches = [&](const v1::RankStatus& s) {
    return s.job() == job && s.phase() == phase && (rank < 0 || s.rank() == rank);
  };
  for (const auto& m : ms) {
    if (m.has_rank_status() && matches(m.rank_status())) return &m.rank_status();
    for (const v1::RankStatus& s : m.rank_statuses().statuses()) {
      if (matches(s)) return &s;
    }
  }
  return nullptr;
}

}  // namespace loom::worker::testing
