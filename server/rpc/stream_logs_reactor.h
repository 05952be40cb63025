// StreamLogsReactor: one StreamJobLogs stream on gRPC's callback API. Between reads it holds no
// thread: the log store's listener (log_store.h AddListener) wakes it when the job's log grows,
// and a timer every kStreamPoll re-checks whether the job has ended (lines written just before
// the terminal state are still sent: the stream ends only after one more read to the end once
// the job is finished).
//
// Lifetime: created by JobServiceImpl::StreamJobLogs, deleted by itself in OnDone. The listener
// and the timer reach it through shared objects that outlive it (see Link and Waker).
#pragma once

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "loom/v1/job.grpc.pb.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/log_store.h"
#include "server/rpc/stream_limiter.h"

namespace loom::rpc {

class StreamLogsReactor final : public grpc::ServerWriteReactor<v1::LogLine> {
 public:
  struct Params {
    jobs::JobManager* manager = nullptr;
    jobs::LogStore* logs = nullptr;
    std::string name;  // jobs/{id}
    std::string id;    // {id}
    std::optional<int> rank;
    bool follow = false;
    bool finished = false;  // the job was already terminal when the stream started
    std::unique_ptr<StreamSlot> slot;
  };
  static StreamLogsReactor* Start(Params params);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // The timer's callback reaches the reactor through the Link (cleared by OnDone). The log
  // listener only cuts the timer short, through the Waker, and never waits for the reactor:
  // it may run under the job manager's lock, which Wake() takes while it holds the Link.
  struct Link {
    absl::Mutex mu;
    StreamLogsReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  };
  struct Waker {
    absl::Mutex mu;
    // A fresh Alarm per wait (an Alarm is set once); the previous one is kept until the next
    // wait, since its callback may still be returning when the next wait is armed.
    std::unique_ptr<grpc::Alarm> timer ABSL_GUARDED_BY(mu);
    std::unique_ptr<grpc::Alarm> spent ABSL_GUARDED_BY(mu);
    // The log grew since the last wait was armed: the next wait ends at once (no lost wake-up
    // between the reactor's last read and its arming the timer).
    bool grew ABSL_GUARDED_BY(mu) = false;
  };

  explicit StreamLogsReactor(Params params);
  // Sends what is read, reads on until caught up, then waits (timer) or finishes. Runs only on
  // gRPC's threads (never from the log listener, which may hold the job manager's lock). gRPC
  // calls are made after mu_ is released.
  void Pump();
  // The timer fired (or was cancelled early by the listener): re-check the job's end, then pump.
  void Wake();
  void ArmTimerLocked(absl::Duration delay) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Params params_;
  const std::shared_ptr<Link> link_;
  const std::shared_ptr<Waker> waker_;
  uint64_t listener_ = 0;

  absl::Mutex mu_;
  int64_t offset_ ABSL_GUARDED_BY(mu_) = 0;
  bool final_pass_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::LogLine> pending_ ABSL_GUARDED_BY(mu_);
  v1::LogLine current_;  // the write in flight (owned while writing_)
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool timer_armed_ ABSL_GUARDED_BY(mu_) = false;
  bool quiet_ ABSL_GUARDED_BY(mu_) = false;  // the last wait saw no growth: skip one read
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::rpc
