// SessionClient: the worker's side of NodeService — RegisterNode, then one Session stream.
//
// Up the stream: `hello` first (the node id and every (job, generation, ranks) running now, so a
// restarted loomd can reconcile), then heartbeats at the interval RegisterNode returned, and the
// rank statuses, step reports and logs from the OutboundBuffer (consecutive statuses as one
// `rank_statuses` message when RegisterNode said loomd reads them). Down: `assign` and `cancel`,
// handed to the callbacks (the supervisor), which must not block.
//
// When loomd goes away the ranks keep running: the client reconnects with capped exponential
// backoff (backoff_initial doubling up to backoff_max, reset once a session is established),
// registers again and says hello again. Everything produced meanwhile waits in the buffer (see
// outbound_buffer.h for its bounds and for how EXITED statuses are never lost).
//
// Threading: Start() runs one session thread (connect, register, write); while a stream is open a
// second thread reads it. Stop() and the accessors are thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "loom/v1/node.grpc.pb.h"
#include "worker/agent/outbound_buffer.h"

namespace loom::worker {

struct SessionCallbacks {
  // The running jobs for hello. Called on the session thread.
  std::function<std::vector<loom::v1::RunningJob>()> running_jobs;
  // Called on the reader thread for each message from loomd; must return quickly.
  std::function<void(loom::v1::Assignment)> on_assign;
  std::function<void(const loom::v1::CancelAssignment&)> on_cancel;
  std::function<void(const loom::v1::DumpStacks&)> on_dump_stacks;
  std::function<void(const loom::v1::TraceRequest&)> on_trace_request;
};

struct SessionOptions {
  std::string coordinator;  // host:port of loomd
  loom::v1::RegisterNodeRequest registration;
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // default: insecure
  // The node's join token, sent as "authorization: Bearer ..." (empty: none; a client
  // certificate in `credentials` may identify the node instead).
  std::string bearer_token;
  absl::Duration backoff_initial = absl::Milliseconds(100);
  absl::Duration backoff_max = absl::Seconds(2);
  absl::Duration rpc_timeout = absl::Seconds(5);  // RegisterNode's deadline
  // Used when loomd returns no (or an absurd) interval; the interval is clamped to [50ms, 60s].
  absl::Duration default_heartbeat = absl::Seconds(5);
};

class SessionClient {
 public:
  // `buffer` must outlive the client.
  SessionClient(SessionOptions options, OutboundBuffer* buffer, SessionCallbacks callbacks);
  ~SessionClient();  // Stop(zero flush) if still running
  SessionClient(const SessionClient&) = delete;
  SessionClient& operator=(const SessionClient&) = delete;

  // Starts the session thread. Call once.
  void Start();

  // Waits up to `flush_timeout` for the buffer to be sent (when connected), then half-closes the
  // stream and waits (within the same timeout) for loomd to end the call, so every message
  // written has been read by loomd when Stop() returns; then joins the threads. A zero timeout,
  // or a deadline that passes, cancels the call instead (messages in flight may be lost).
  // Idempotent.
  void Stop(absl::Duration flush_timeout);

  // True while a Session stream is open (hello sent).
  bool connected() const { return connected_.load(); }
  // Number of successful RegisterNode calls so far.
  int64_t registrations() const { return registrations_.load(); }
  // Number of Session streams opened so far.
  int64_t sessions() const { return sessions_.load(); }
  // The heartbeat interval in use (after the first registration).
  absl::Duration heartbeat_interval() const;

 private:
  void Run();
  // One connection: register, open the stream, exchange until it breaks or Stop(). Returns why it
  // ended; sets `established` when the stream was opened.
  absl::Status RunOnce(bool* established);
  // Sleeps `d` unless Stop() is called first.
  // Adds the join token, when there is one, to a call to loomd.
  void AddCredentials(grpc::ClientContext* context) const;
  void SleepUnlessStopped(absl::Duration d);

  const SessionOptions options_;
  OutboundBuffer* const buffer_;
  const SessionCallbacks callbacks_;

  std::atomic<bool> stop_{false};
  // Set by Stop() with a flush timeout while connected: the stream ends by half-close, not by
  // cancellation, and close_deadline_ bounds the wait for loomd's end of the call.
  std::atomic<bool> graceful_{false};
  absl::Time close_deadline_ = absl::InfinitePast();  // guarded by mu_
  std::atomic<bool> connected_{false};
  std::atomic<int64_t> registrations_{0};
  std::atomic<int64_t> sessions_{0};
  std::atomic<int64_t> heartbeat_ms_{0};

  std::mutex mu_;  // guards context_ and stop waits
  std::condition_variable cv_;
  grpc::ClientContext* context_ = nullptr;  // the call in progress, for Stop() to cancel
  std::thread thread_;
  std::once_flag stop_once_;
};

}  // namespace loom::worker
