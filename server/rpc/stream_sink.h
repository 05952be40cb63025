// StreamSink: the SessionSink of one Session call. Send() queues (never blocks); Run() is the
// writer loop that drains the queue into the stream on its own thread.
//
// Bound: a worker that stops reading while loomd keeps sending (more than kMaxQueued messages
// waiting) gets its session cancelled; it reconnects and is reconciled, which is safer than
// growing memory without limit.
//
// Threading: Send/Close from any thread; Run on exactly one thread.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/sync_stream.h>

#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "loom/v1/node.pb.h"
#include "server/nodes/session_sink.h"

namespace loom::rpc {

class StreamSink final : public nodes::SessionSink {
 public:
  static constexpr size_t kMaxQueued = 10000;

  // `context` belongs to the call and outlives the sink's use by the manager (the handler
  // closes the session before it returns).
  explicit StreamSink(grpc::ServerContext* context) : context_(context) {}

  bool Send(const v1::CoordinatorMessage& message) override;
  // Ends the session from loomd's side: cancels the call so that the reader wakes up.
  void Close() override;
  // Ends the writer without cancelling the call (the handler is finishing normally).
  void Finish();
  // True when Close() was called (the manager ended the session).
  bool closed_by_loomd() const;

  // Writes queued messages until Close()/Finish() or a failed write.
  void Run(grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream);

 private:
  grpc::ServerContext* const context_;
  mutable absl::Mutex mu_;
  std::deque<v1::CoordinatorMessage> queue_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_by_loomd_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace loom::rpc
