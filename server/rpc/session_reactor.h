// SessionReactor: one worker's Session stream (bidirectional) on gRPC's callback API, so that an
// open session holds no thread: a thousand workers cost a thousand reactors, not the two threads
// each (reader and writer) that the sync API needed.
//
// Upward, the reactor keeps one read outstanding: the first message must be `hello` (the caller
// must hold a node credential for its node id), which opens the session in the job manager; every
// later message goes to JobManager::HandleWorkerMessage from the read callback. Downward, the
// manager queues CoordinatorMessages into the session's sink (SessionQueue) without blocking,
// under its own lock; the sink pokes the reactor, which starts the next write when none is in
// flight. A worker that stops reading while loomd keeps sending (more than kMaxQueued waiting)
// gets its session cancelled; it reconnects and is reconciled.
//
// The stream ends when the worker closes it or goes away (the session is closed in the
// manager), when the manager ends the session (a newer session replaced it, the node was
// declared LOST or deleted, loomd shuts down: the stream ends ABORTED with why; the pending
// read then fails), or when the manager refuses a message with FAILED_PRECONDITION.
//
// Lifetime: created by NodeServiceImpl::Session, deleted by itself in OnDone (gRPC's contract).
// The sink outlives it (the manager may hold it a little longer); it reaches the reactor through
// a pointer that OnDone clears under the sink's link lock, so a late Send never touches a
// deleted reactor.
//
// Threading: the reactions (OnReadDone, OnWriteDone, OnCancel, OnDone) run on gRPC's threads,
// possibly at once; the state they share is guarded by mu_. Lock order: the manager's lock, then
// the sink's link lock, then mu_. gRPC calls are made after mu_ is released, except StartRead
// (it never blocks), which is started under mu_ so that it can never follow Finish().
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "loom/v1/node.grpc.pb.h"
#include "server/auth/authenticator.h"
#include "server/jobs/job_manager.h"
#include "server/nodes/session_sink.h"

namespace loom::rpc {

class SessionReactor;

// The downward half as the manager sees it: a bounded queue drained by the reactor's writes.
class SessionQueue final : public nodes::SessionSink {
 public:
  static constexpr size_t kMaxQueued = 10000;

  bool Send(const v1::CoordinatorMessage& message) override;
  // Ends the session from loomd's side: the reactor finishes the call ABORTED (or cancels it
  // when a write is stuck in flight).
  void Close() override;

  // For the reactor: the next message to write, if any.
  std::optional<v1::CoordinatorMessage> Pop();
  // No more messages (the stream is ending normally); later Sends return false.
  void Finish();
  // True when Close() was called (the manager ended the session, or the queue overflowed).
  bool closed_by_loomd() const;
  // Sets (or, with nullptr, clears, waiting for a poke in progress) the reactor to poke.
  void Attach(SessionReactor* reactor);

 private:
  // Pokes the attached reactor (starts a write if none is in flight).
  void Poke();

  mutable absl::Mutex mu_;
  std::deque<v1::CoordinatorMessage> queue_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_by_loomd_ ABSL_GUARDED_BY(mu_) = false;

  // Held while the reactor is used from here, so that OnDone can wait for that to end.
  absl::Mutex link_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  SessionReactor* reactor_ ABSL_GUARDED_BY(link_mu_) = nullptr;
};

class SessionReactor final
    : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
 public:
  // Starts reading the session's hello. `manager` and `authenticator` outlive the reactor.
  static SessionReactor* Start(grpc::CallbackServerContext* context, jobs::JobManager* manager,
                               auth::Authenticator* authenticator);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override {}  // the pending read fails next, which ends the stream
  void OnDone() override;

  // Starts the next write; finishes the stream once reading ended (or loomd ended the session)
  // and no write is in flight.
  void Pump();

 private:
  SessionReactor(grpc::CallbackServerContext* context, jobs::JobManager* manager,
                 auth::Authenticator* authenticator);
  // Handles the first message: authorizes, opens the session. Returns the error to end with.
  grpc::Status OpenSession();
  // The read side is over (`status`: how the stream should end): closes the session in the
  // manager once, then finishes as soon as no write is in flight.
  void EndReading(grpc::Status status);

  grpc::CallbackServerContext* const context_;
  jobs::JobManager* const manager_;
  auth::Authenticator* const authenticator_;
  const std::shared_ptr<SessionQueue> queue_;

  v1::WorkerMessage read_;  // the read in flight (one at a time)
  std::string node_id_;     // set by the hello (read side only)
  std::optional<uint64_t> session_id_;

  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_over_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  v1::CoordinatorMessage write_;  // the write in flight (owned while writing_)
};

}  // namespace loom::rpc
