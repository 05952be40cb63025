#include "worker/train/comm/grpc_rendezvous_store.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "loom/v1/rendezvous.grpc.pb.h"
#include "worker/train/comm/communicator.h"

namespace loom::train {
namespace {

using Clock = std::chrono::system_clock;

// Beyond a Wait's own timeout, so that loomd answers DEADLINE_EXCEEDED with the missing keys
// before the client's deadline cuts the call with a bare "Deadline Exceeded".
constexpr std::chrono::seconds kWaitDeadlineSlack{10};
// Pause between tries of a call that failed UNAVAILABLE.
constexpr std::chrono::milliseconds kRetryPause{200};

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN_CODE";
  }
}

// The channel's credentials: TLS against LOOM_TLS_CA (the CA that signed loomd's certificate,
// set by loom-worker when it talks TLS to loomd), else plaintext. A CA file that cannot be read
// is a configuration error of the node.
std::shared_ptr<grpc::ChannelCredentials> RendezvousCredentials() {
  const char* ca = std::getenv("LOOM_TLS_CA");
  if (ca == nullptr || ca[0] == '\0') return grpc::InsecureChannelCredentials();
  std::ifstream in(ca);
  std::stringstream pem;
  pem << in.rdbuf();
  if (!in || pem.str().empty()) {
    throw CommError(
        std::string("LOOM_TLS_CA=") + ca +
        ": cannot read the CA bundle that verifies loomd; check loom-worker's --tls-ca");
  }
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = pem.str();
  return grpc::SslCredentials(options);
}

std::string Seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

// "world/0" or "3 keys (world/0, world/1, ...)", for messages.
std::string KeyList(const std::vector<std::string>& keys) {
  if (keys.size() == 1) return keys[0];
  std::string out = std::to_string(keys.size()) + " keys (";
  for (size_t i = 0; i < keys.size() && i < 3; ++i) out += (i ? ", " : "") + keys[i];
  return out + (keys.size() > 3 ? ", ...)" : ")");
}

class GrpcRendezvousStore : public KeyValueStore {
 public:
  GrpcRendezvousStore(const std::string& address, const std::string& job, int64_t generation,
                      std::chrono::milliseconds timeout)
      : address_(address),
        timeout_(timeout),
        channel_(grpc::CreateChannel(address, RendezvousCredentials())),
        stub_(v1::RendezvousService::NewStub(channel_)) {
    // The gang's secret (LOOM_RENDEZVOUS_SECRET, from loom-worker) opens this scope only.
    if (const char* secret = std::getenv("LOOM_RENDEZVOUS_SECRET"); secret != nullptr) {
      secret_ = secret;
    }
    scope_.set_job(job);
    scope_.set_generation(generation);
  }

  void Set(const std::string& key, const std::string& value) override {
    v1::SetRequest request;
    *request.mutable_scope() = scope_;
    request.set_key(key);
    request.set_value(value);
    v1::SetResponse response;
    Call("Set " + key, timeout_,
         [&](grpc::ClientContext* context) { return stub_->Set(context, request, &response); });
  }

  std::vector<std::string> Wait(const std::vector<std::string>& keys,
                                std::chrono::milliseconds timeout) override {
    if (keys.empty()) return {};
    v1::WaitRequest request;
    *request.mutable_scope() = scope_;
    for (const std::string& key : keys) request.add_keys(key);
    // 0 would mean loomd's default (300 s), not "do not wait".
    request.set_timeout_ms(std::max<int64_t>(1, timeout.count()));
    v1::WaitResponse response;
    Call("Wait for " + KeyList(keys), timeout + kWaitDeadlineSlack,
         [&](grpc::ClientContext* context) { return stub_->Wait(context, request, &response); });
    if (response.values_size() != static_cast<int>(keys.size())) {
      throw CommError("loomd answered Wait for " + KeyList(keys) + " with " +
                      std::to_string(response.values_size()) + " values");
    }
    return std::vector<std::string>(response.values().begin(), response.values().end());
  }

  std::string Describe() const override {
    return "loomd at " + address_ + " (" + scope_.job() + ", generation " +
           std::to_string(scope_.generation()) + ")";
  }

 private:
  // Runs `rpc` until it succeeds, fails with a code other than UNAVAILABLE, or `budget` has
  // passed since the first try; throws CommError on failure. wait_for_ready makes a call wait
  // for a connection (loomd still starting) instead of failing at once.
  void Call(const std::string& what, std::chrono::milliseconds budget,
            const std::function<grpc::Status(grpc::ClientContext*)>& rpc) {
    const Clock::time_point deadline = Clock::now() + budget;
    grpc::Status status;
    while (true) {
      grpc::ClientContext context;
      context.set_deadline(deadline);
      context.set_wait_for_ready(true);
      if (!secret_.empty()) context.AddMetadata("x-loom-rendezvous-secret", secret_);
      status = rpc(&context);
      if (status.ok()) return;
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE ||
          Clock::now() + kRetryPause >= deadline) {
        break;
      }
      std::this_thread::sleep_for(kRetryPause);
    }
    // A deadline that passed without a connection means loomd was never reached: say so, since
    // gRPC's own message ("Deadline Exceeded") does not.
    const bool connected = channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY;
    if (!connected && (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                       status.error_code() == grpc::StatusCode::UNAVAILABLE)) {
      throw CommError("cannot reach loomd's RendezvousService at " + address_ + " within " +
                      Seconds(budget) + " (" + what + ": " + CodeName(status.error_code()) + ": " +
                      status.error_message() +
                      "); is loomd running, and is LOOM_RENDEZVOUS its address?");
    }
    throw CommError(what + ": " + CodeName(status.error_code()) + ": " + status.error_message());
  }

  const std::string address_;
  const std::chrono::milliseconds timeout_;
  v1::RendezvousScope scope_;
  std::string secret_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::RendezvousService::Stub> stub_;
};

}  // namespace

std::unique_ptr<KeyValueStore> OpenGrpcRendezvousStore(const std::string& address,
                                                       const std::string& job, int64_t generation,
                                                       std::chrono::milliseconds timeout) {
  return std::make_unique<GrpcRendezvousStore>(address, job, generation, timeout);
}

}  // namespace loom::train
