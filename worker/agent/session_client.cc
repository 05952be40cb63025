#include "worker/agent/session_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/rank_status_batch.h"
#include "google/protobuf/util/time_util.h"

namespace loom::worker {
namespace {

std::shared_ptr<grpc::Channel> MakeChannel(const SessionOptions& options) {
  grpc::ChannelArguments args;
  // A private subchannel pool: a fresh channel per attempt must not inherit the backoff state
  // of a shared subchannel that failed while loomd was down.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  // Detects a loomd host that vanished without closing the connection.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetMaxReceiveMessageSize(16 << 20);
  auto creds = options.credentials ? options.credentials : grpc::InsecureChannelCredentials();
  return grpc::CreateCustomChannel(options.coordinator, creds, args);
}

}  // namespace

SessionClient::SessionClient(SessionOptions options, OutboundBuffer* buffer,
                             SessionCallbacks callbacks)
    : options_(std::move(options)), buffer_(buffer), callbacks_(std::move(callbacks)) {}

SessionClient::~SessionClient() { Stop(absl::ZeroDuration()); }

void SessionClient::Start() {
  thread_ = std::thread([this] { Run(); });
}

absl::Duration SessionClient::heartbeat_interval() const {
  return absl::Milliseconds(heartbeat_ms_.load());
}

void SessionClient::Stop(absl::Duration flush_timeout) {
  std::call_once(stop_once_, [&] {
    if (!thread_.joinable()) return;
    const absl::Time deadline = absl::Now() + flush_timeout;
    bool graceful = false;
    if (connected_.load() && flush_timeout > absl::ZeroDuration()) {
      if (!buffer_->WaitDrained(deadline)) {
        LOOM_LOG(WARNING) << "session: " << buffer_->size()
                          << " message(s) not sent to loomd before shutdown";
      }
      graceful = true;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      close_deadline_ = deadline;
      graceful_.store(graceful);
      stop_.store(true);
      // A written message is only queued in the transport; cancelling now could drop it. The
      // graceful path half-closes from the session thread instead (RunOnce).
      if ((!graceful || !connected_.load()) && context_ != nullptr) context_->TryCancel();
    }
    cv_.notify_all();
    buffer_->Wake();
    thread_.join();
  });
}

void SessionClient::AddCredentials(grpc::ClientContext* context) const {
  if (!options_.bearer_token.empty()) {
    context->AddMetadata("authorization", "Bearer " + options_.bearer_token);
  }
}

void SessionClient::SleepUnlessStopped(absl::Duration d) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, absl::ToChronoNanoseconds(d), [this] { return stop_.load(); });
}

void SessionClient::Run() {
  absl::Duration backoff = options_.backoff_initial;
  absl::Status last_error;
  while (!stop_.load()) {
    bool established = false;
    absl::Status st = RunOnce(&established);
    connected_.store(false);
    if (stop_.load()) break;
    if (established) backoff = options_.backoff_initial;
    // Log a repeated failure once, not at every retry.
    if (established || st.ToString() != last_error.ToString()) {
      LOOM_LOG(WARNING) << "session with loomd at " << options_.coordinator << " ended: " << st
                        << "; reconnecting (backoff up to "
                        << absl::FormatDuration(options_.backoff_max) << ")";
    }
    last_error = st;
    SleepUnlessStopped(backoff);
    backoff = std::min(backoff * 2, options_.backoff_max);
  }
}

absl::Status SessionClient::RunOnce(bool* established) {
  std::shared_ptr<grpc::Channel> channel = MakeChannel(options_);
  std::unique_ptr<loom::v1::NodeService::Stub> stub = loom::v1::NodeService::NewStub(channel);

  loom::v1::RegisterNodeResponse registered;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    AddCredentials(&ctx);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_.load()) return absl::CancelledError("stopping");
      context_ = &ctx;  // so that Stop() need not wait for the deadline
    }
    grpc::Status st = stub->RegisterNode(&ctx, options_.registration, &registered);
    {
      std::lock_guard<std::mutex> lock(mu_);
      context_ = nullptr;
    }
    if (!st.ok()) return FromGrpcStatus(st);
  }
  absl::Duration interval = absl::Milliseconds(registered.heartbeat_interval_ms());
  if (interval <= absl::ZeroDuration()) interval = options_.default_heartbeat;
  interval = std::clamp(interval, absl::Milliseconds(50), absl::Seconds(60));
  heartbeat_ms_.store(absl::ToInt64Milliseconds(interval));
  // Statuses queued together (a gang's start or end) go up as one message to a loomd that reads
  // batches; an older loomd gets them one per message.
  const int max_batch = registered.accepts_rank_status_batches() ? kMaxRankStatusesPerBatch : 1;
  if (registrations_.fetch_add(1) == 0) {
    LOOM_LOG(INFO) << "session: registered as nodes/" << options_.registration.node_id()
                   << " with loomd at " << options_.coordinator << "; heartbeat every "
                   << absl::FormatDuration(interval);
  }

  grpc::ClientContext ctx;
  AddCredentials(&ctx);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_.load()) return absl::CancelledError("stopping");
    context_ = &ctx;
  }
  auto clear_context = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    context_ = nullptr;
  };
  std::unique_ptr<grpc::ClientReaderWriter<loom::v1::WorkerMessage, loom::v1::CoordinatorMessage>>
      stream = stub->Session(&ctx);

  loom::v1::WorkerMessage hello;
  hello.mutable_hello()->set_node_id(options_.registration.node_id());
  if (callbacks_.running_jobs) {
    for (loom::v1::RunningJob& job : callbacks_.running_jobs()) {
      *hello.mutable_hello()->add_running() = std::move(job);
    }
  }
  if (!stream->Write(hello)) {
    grpc::Status st = stream->Finish();
    clear_context();
    return st.ok() ? absl::UnavailableError("the session closed at hello") : FromGrpcStatus(st);
  }
  buffer_->RequeueSentExits();
  sessions_.fetch_add(1);
  connected_.store(true);
  *established = true;
  LOOM_LOG(INFO) << "session: connected to loomd at " << options_.coordinator << " ("
                 << hello.hello().running_size() << " running job(s) in hello)";

  // `over` ends the writer loop: set by the reader when the stream breaks, or by Stop().
  std::atomic<bool> over{false};
  std::thread reader([&] {
    loom::v1::CoordinatorMessage message;
    while (stream->Read(&message)) {
      if (message.has_assign()) {
        if (callbacks_.on_assign) callbacks_.on_assign(std::move(*message.mutable_assign()));
      } else if (message.has_cancel()) {
        if (callbacks_.on_cancel) callbacks_.on_cancel(message.cancel());
      } else if (message.has_dump_stacks()) {
        if (callbacks_.on_dump_stacks) callbacks_.on_dump_stacks(message.dump_stacks());
      } else if (message.has_trace_request()) {
        if (callbacks_.on_trace_request) callbacks_.on_trace_request(message.trace_request());
      } else {
        LOOM_LOG(WARNING) << "session: ignoring a coordinator message of unknown kind";
      }
      message.Clear();
    }
    over.store(true);
    buffer_->Wake();
  });

  absl::Status why = absl::UnavailableError("the session stream broke");
  absl::Time next_heartbeat = absl::Now();
  while (!over.load() && !stop_.load()) {
    bool more = false;
    std::optional<loom::v1::WorkerMessage> m =
        buffer_->Pop(next_heartbeat, &over, &more, max_batch);
    if (m) {
      // A burst (a gang's start: a status per rank) leaves in as few socket writes as gRPC can
      // make of it: a message with another queued behind it is only buffered, and the last one
      // of the burst, written without the hint, flushes them all.
      grpc::WriteOptions options;
      if (more) options.set_buffer_hint();
      if (!stream->Write(*m, options)) {
        buffer_->Unpop(std::move(*m));
        break;
      }
      buffer_->MarkSent(*m);
      continue;
    }
    if (absl::Now() >= next_heartbeat) {
      loom::v1::WorkerMessage hb;
      *hb.mutable_heartbeat()->mutable_time() =
          google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(absl::Now()));
      if (!stream->Write(hb)) break;
      next_heartbeat = absl::Now() + interval;
    }
  }
  if (stop_.load()) why = absl::CancelledError("stopping");
  if (stop_.load() && graceful_.load() && !over.load()) {
    // Half-close: loomd reads what is left, then ends the call, which ends the reader. Only then
    // has every message we wrote (a rank's final exit above all) been read on the other side.
    stream->WritesDone();
    absl::Time deadline;
    {
      std::lock_guard<std::mutex> lock(mu_);
      deadline = close_deadline_;
    }
    while (!over.load() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
    if (!over.load()) {
      LOOM_LOG(WARNING) << "session: loomd did not end the session within the shutdown flush";
    }
  }
  connected_.store(false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ctx.TryCancel();  // unblocks the reader
  }
  reader.join();
  grpc::Status st = stream->Finish();
  clear_context();
  if (!st.ok() && !stop_.load()) why = FromGrpcStatus(st);
  return why;
}

}  // namespace loom::worker
