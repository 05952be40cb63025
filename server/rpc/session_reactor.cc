#include "server/rpc/session_reactor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "server/rpc/call_auth.h"

namespace loom::rpc {

// ---- SessionQueue -----------------------------------------------------------------------------

bool SessionQueue::Send(const v1::CoordinatorMessage& message) {
  bool overflow = false;
  {
    absl::MutexLock lock(&mu_);
    if (done_) return false;
    if (queue_.size() >= kMaxQueued) {
      overflow = true;
    } else {
      queue_.push_back(message);
    }
  }
  if (overflow) {
    Close();
    return false;
  }
  Poke();
  return true;
}

void SessionQueue::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (done_) return;
    done_ = true;
    closed_by_loomd_ = true;
  }
  Poke();  // the reactor finishes the call (ABORTED), or cancels a write that does not drain
}

std::optional<v1::CoordinatorMessage> SessionQueue::Pop() {
  absl::MutexLock lock(&mu_);
  // After Close() or Finish() nothing more is written: undelivered messages are reconciled on
  // the worker's next hello.
  if (done_ || queue_.empty()) return std::nullopt;
  v1::CoordinatorMessage message = std::move(queue_.front());
  queue_.pop_front();
  return message;
}

void SessionQueue::Finish() {
  absl::MutexLock lock(&mu_);
  done_ = true;
}

bool SessionQueue::closed_by_loomd() const {
  absl::MutexLock lock(&mu_);
  return closed_by_loomd_;
}

void SessionQueue::Attach(SessionReactor* reactor) {
  absl::MutexLock link(&link_mu_);
  reactor_ = reactor;
}

void SessionQueue::Poke() {
  absl::MutexLock link(&link_mu_);
  if (reactor_ != nullptr) reactor_->Pump();
}

// ---- SessionReactor ---------------------------------------------------------------------------

namespace {

constexpr char kEndedByLoomd[] =
    "loomd ended this session (replaced by a newer session of the node, node declared LOST or "
    "deleted, or shutdown); reconnect with hello";

}  // namespace

SessionReactor::SessionReactor(grpc::CallbackServerContext* context, jobs::JobManager* manager,
                               auth::Authenticator* authenticator)
    : context_(context),
      manager_(manager),
      authenticator_(authenticator),
      queue_(std::make_shared<SessionQueue>()) {}

SessionReactor* SessionReactor::Start(grpc::CallbackServerContext* context,
                                      jobs::JobManager* manager,
                                      auth::Authenticator* authenticator) {
  auto* reactor = new SessionReactor(context, manager, authenticator);
  reactor->queue_->Attach(reactor);
  reactor->StartRead(&reactor->read_);
  return reactor;
}

grpc::Status SessionReactor::OpenSession() {
  if (!read_.has_hello()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "the first message of a session must be hello (after RegisterNode)");
  }
  node_id_ = read_.hello().node_id();
  if (absl::Status s = AuthorizeNode(context_, authenticator_, node_id_); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<uint64_t> id = manager_->OpenSession(read_.hello(), queue_);
  if (!id.ok()) return ToGrpcStatus(id.status());
  session_id_ = *id;
  return grpc::Status::OK;
}

void SessionReactor::OnReadDone(bool ok) {
  if (!ok) {
    EndReading(session_id_.has_value()
                   ? grpc::Status::OK
                   : grpc::Status(grpc::StatusCode::CANCELLED, "the session ended before hello"));
    return;
  }
  if (!session_id_.has_value()) {
    if (grpc::Status s = OpenSession(); !s.ok()) {
      EndReading(s);
      return;
    }
  } else {
    absl::Status status = manager_->HandleWorkerMessage(node_id_, *session_id_, read_);
    if (absl::IsFailedPrecondition(status)) {
      EndReading(ToGrpcStatus(status));
      return;
    }
    if (!status.ok()) {
      LOOM_LOG(WARNING) << "nodes/" << node_id_ << ": bad session message ignored: " << status;
    }
  }
  {
    // No operation may start after Finish(): loomd may have ended the session (Pump) while this
    // message was handled. Checked and started under mu_, which Pump holds to decide to finish.
    absl::MutexLock lock(&mu_);
    if (!finished_) {
      StartRead(&read_);
      return;
    }
  }
  EndReading(grpc::Status::OK);  // closes the session in the manager; the call is finished
}

void SessionReactor::EndReading(grpc::Status status) {
  // Read the reason before finishing the queue: a manager Close() after this point is a no-op.
  const bool by_loomd = queue_->closed_by_loomd();
  queue_->Finish();
  if (session_id_.has_value()) manager_->CloseSession(node_id_, *session_id_);
  if (by_loomd && status.ok()) status = grpc::Status(grpc::StatusCode::ABORTED, kEndedByLoomd);
  bool write_in_flight = false;
  {
    absl::MutexLock lock(&mu_);
    reading_over_ = true;
    status_ = std::move(status);
    write_in_flight = writing_;
  }
  // A write still in flight may never complete (a worker that stopped reading): cancel it rather
  // than hold the call open; the message is reconciled on the worker's next hello.
  if (write_in_flight) context_->TryCancel();
  Pump();
}

void SessionReactor::Pump() {
  enum class Action { kNone, kWrite, kFinish, kCancel } action = Action::kNone;
  grpc::Status status;
  const bool by_loomd = queue_->closed_by_loomd();
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (by_loomd && !reading_over_) {
      // The manager ended the session (or its queue overflowed): finish with why; a write that
      // is still in flight (a worker that stopped reading) is cancelled instead.
      if (!writing_) {
        finished_ = true;
        status = grpc::Status(grpc::StatusCode::ABORTED, kEndedByLoomd);
        action = Action::kFinish;
      } else if (!cancelled_) {
        cancelled_ = true;
        action = Action::kCancel;
      }
    } else if (!writing_) {
      if (!reading_over_ && !write_failed_) {
        if (std::optional<v1::CoordinatorMessage> next = queue_->Pop(); next.has_value()) {
          write_ = std::move(*next);
          writing_ = true;
          action = Action::kWrite;
        }
      }
      if (action == Action::kNone && reading_over_) {
        finished_ = true;
        status = status_;
        action = Action::kFinish;
      }
    }
  }
  if (action == Action::kWrite) StartWrite(&write_);
  if (action == Action::kFinish) Finish(status);  // OnDone follows, on another thread
  if (action == Action::kCancel) context_->TryCancel();
}

void SessionReactor::OnWriteDone(bool ok) {
  bool cancel = false;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok && !write_failed_) {
      // The worker went away or stopped reading: end the call so the pending read fails too.
      write_failed_ = true;
      cancel = true;
    }
  }
  if (cancel) context_->TryCancel();
  Pump();
}

void SessionReactor::OnDone() {
  queue_->Attach(nullptr);  // waits for a poke in progress
  delete this;
}

}  // namespace loom::rpc
