// Helpers for the loomd tests (job manager, nodes, rpc): a session sink that captures what loomd
// would send to a worker, and builders for specs, registrations and worker reports.
#pragma once

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"
#include "server/nodes/session_sink.h"

namespace loom::testing {

// Captures CoordinatorMessages instead of writing them to a stream.
class FakeSink final : public nodes::SessionSink {
 public:
  bool Send(const v1::CoordinatorMessage& message) override {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    messages_.push_back(message);
    return true;
  }
  void Close() override {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  bool closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
  }
  // Every message so far, and forgets them.
  std::vector<v1::CoordinatorMessage> Take() {
    absl::MutexLock lock(&mu_);
    std::vector<v1::CoordinatorMessage> out;
    out.swap(messages_);
    return out;
  }
  std::vector<v1::Assignment> TakeAssignments() {
    std::vector<v1::Assignment> out;
    for (const v1::CoordinatorMessage& m : Take()) {
      if (m.has_assign()) out.push_back(m.assign());
    }
    return out;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::CoordinatorMessage> messages_;
  bool closed_ = false;
};

// A small CPU job: the tiny model on the built-in corpus.
inline v1::JobSpec CpuSpec(int devices, int max_restarts = 0, double backoff_seconds = 1.0) {
  v1::JobSpec spec;
  spec.set_name("test-job");
  spec.mutable_model()->set_preset("tiny");
  spec.mutable_data()->set_builtin("tiny-corpus");
  spec.mutable_train()->set_steps(10);
  spec.mutable_resources()->set_cpu_devices(devices);
  spec.mutable_restart()->set_max_restarts(max_restarts);
  spec.mutable_restart()->set_backoff_seconds(backoff_seconds);
  return spec;
}

inline v1::CreateJobRequest CreateRequest(const v1::JobSpec& spec,
                                          const std::string& request_id = "") {
  v1::CreateJobRequest request;
  *request.mutable_spec() = spec;
  request.set_request_id(request_id);
  return request;
}

inline v1::RegisterNodeRequest CpuNode(const std::string& id, int devices) {
  v1::RegisterNodeRequest request;
  request.set_node_id(id);
  request.set_hostname(id + ".local");
  for (int i = 0; i < devices; ++i) {
    v1::Device* d = request.add_devices();
    d->set_kind(v1::DEVICE_KIND_CPU);
    d->set_index(i);
    d->set_model("cpu");
  }
  return request;
}

inline v1::WorkerMessage RankPhase(const std::string& job, int64_t generation, int rank,
                                   v1::RankPhase phase) {
  v1::WorkerMessage m;
  v1::RankStatus* s = m.mutable_rank_status();
  s->set_job(job);
  s->set_generation(generation);
  s->set_rank(rank);
  s->set_phase(phase);
  return m;
}

inline v1::WorkerMessage RankExit(const std::string& job, int64_t generation, int rank,
                                  v1::ExitClass exit_class, const std::string& message = "") {
  v1::WorkerMessage m = RankPhase(job, generation, rank, v1::RANK_PHASE_EXITED);
  m.mutable_rank_status()->set_exit_class(exit_class);
  m.mutable_rank_status()->set_message(message);
  if (exit_class == v1::EXIT_CLASS_RETRYABLE) m.mutable_rank_status()->set_signal(9);
  if (exit_class == v1::EXIT_CLASS_PERMANENT) m.mutable_rank_status()->set_exit_code(2);
  return m;
}

inline v1::WorkerMessage Step(const std::string& job, int64_t generation, int rank, int64_t step,
                              int64_t total, double loss) {
  v1::WorkerMessage m;
  v1::StepReport* r = m.mutable_step();
  r->set_job(job);
  r->set_generation(generation);
  r->set_rank(rank);
  r->set_step(step);
  r->set_total_steps(total);
  r->set_loss(loss);
  r->set_tokens_per_second(1000);
  r->set_lr(6e-4);
  r->set_step_seconds(0.5);
  return m;
}

inline v1::WorkerMessage Heartbeat() {
  v1::WorkerMessage m;
  m.mutable_heartbeat();
  return m;
}

}  // namespace loom::testing
