#include "server/rpc/stream_sink.h"

#include <utility>

namespace loom::rpc {

bool StreamSink::Send(const v1::CoordinatorMessage& message) {
  bool overflow = false;
  {
    absl::MutexLock lock(&mu_);
    if (done_) return false;
    if (queue_.size() >= kMaxQueued) {
      overflow = true;
    } else {
      queue_.push_back(message);
      return true;
    }
  }
  if (overflow) Close();
  return false;
}

void StreamSink::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (done_) return;
    done_ = true;
    closed_by_loomd_ = true;
  }
  context_->TryCancel();
}

void StreamSink::Finish() {
  absl::MutexLock lock(&mu_);
  done_ = true;
}

bool StreamSink::closed_by_loomd() const {
  absl::MutexLock lock(&mu_);
  return closed_by_loomd_;
}

void StreamSink::Run(grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) {
  while (true) {
    v1::CoordinatorMessage message;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (done_) return;  // undelivered messages are reconciled on the next hello
      message = std::move(queue_.front());
      queue_.pop_front();
    }
    if (!stream->Write(message)) {
      absl::MutexLock lock(&mu_);
      done_ = true;
      return;
    }
  }
}

}  // namespace loom::rpc
