// WatchJobReactor: one WatchJob stream on gRPC's callback API. It holds no thread while it
// waits: the job's subscription (server/jobs/job_watchers.h) calls back when an update is
// queued, and the reactor starts the next write then; so thousands of open watches cost
// memory (a queue each), not threads.
//
// The stream sends the current job first, then every update, and ends after a terminal state,
// when the client goes away, or when loomd shuts down (the subscription closes).
//
// Lifetime: created by JobServiceImpl::WatchJob, deleted by itself in OnDone (gRPC's contract).
// The subscription's listener reaches the reactor through a shared Link that OnDone clears, so a
// listener call racing with the end of the stream never touches a deleted reactor.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "loom/v1/job.grpc.pb.h"
#include "server/auth/principal.h"
#include "server/jobs/job_watchers.h"
#include "server/rpc/stream_limiter.h"

namespace loom::rpc {

class WatchJobReactor final : public grpc::ServerWriteReactor<v1::JobUpdate> {
 public:
  // Starts streaming `subscription` to `who` (updates are redacted for `who`); `slot` is held
  // until the stream ends.
  static WatchJobReactor* Start(auth::Principal who,
                                std::shared_ptr<jobs::JobSubscription> subscription,
                                std::unique_ptr<StreamSlot> slot);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  struct Link {
    absl::Mutex mu;
    WatchJobReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  };

  WatchJobReactor(auth::Principal who, std::shared_ptr<jobs::JobSubscription> subscription,
                  std::unique_ptr<StreamSlot> slot);
  // Starts the next write, or finishes the stream, when nothing is in flight. gRPC calls are
  // made after mu_ is released (reactions run on gRPC's threads, never inline).
  void Pump();

  const auth::Principal who_;
  const std::shared_ptr<jobs::JobSubscription> subscription_;
  const std::unique_ptr<StreamSlot> slot_;
  const std::shared_ptr<Link> link_;

  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;  // client gone, write failed, or terminal sent
  v1::JobUpdate update_;                    // the write in flight (owned while writing_)
};

}  // namespace loom::rpc
