#include "client/connection.h"

#include <cstdlib>

#include "client/persist_mux.h"
#include "common/grpc_status.h"
#include "common/tls_files.h"

namespace loom::client {

std::string ResolveServerAddress(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("LOOM_SERVER");
  if (env != nullptr && env[0] != '\0') return env;
  return kDefaultServer;
}

absl::StatusOr<std::string> ResolveToken(const std::string& flag, const std::string& file_flag) {
  if (!flag.empty()) return flag;
  std::string file = file_flag;
  if (file.empty()) {
    const char* env = std::getenv("LOOM_TOKEN_FILE");
    if (env != nullptr) file = env;
  }
  if (!file.empty())
    return ReadTokenFile(file, file_flag.empty() ? "LOOM_TOKEN_FILE" : "--token-file");
  const char* env = std::getenv("LOOM_TOKEN");
  return std::string(env == nullptr ? "" : env);
}

Connection::Connection(std::string server, absl::Duration rpc_timeout, std::string token)
    : server_(std::move(server)), rpc_timeout_(rpc_timeout), token_(std::move(token)) {}

Connection::Connection(std::string server, absl::Duration rpc_timeout, std::string token,
                       WireTls tls)
    : server_(std::move(server)),
      rpc_timeout_(rpc_timeout),
      token_(std::move(token)),
      tls_(std::move(tls)) {}

Connection::~Connection() = default;

void Connection::UsePersistentConnection(absl::Duration idle, std::ostream* warnings,
                                         bool automatic) {
  std::lock_guard<std::mutex> lock(persist_mu_);
  persist_idle_ = idle;
  persist_warnings_ = automatic ? nullptr : warnings;
  persist_automatic_ = automatic;
}

std::unique_ptr<WireClient> Connection::Acquire() {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (!idle_.empty()) {
      std::unique_ptr<WireClient> client = std::move(idle_.back());
      idle_.pop_back();
      return client;
    }
  }
  return std::make_unique<WireClient>(server_, token_, tls_);
}

void Connection::Release(std::unique_ptr<WireClient> client) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  idle_.push_back(std::move(client));
}

absl::Status Connection::Call(std::string_view path, const google::protobuf::MessageLite& request,
                              google::protobuf::MessageLite* response) {
  const absl::Time deadline = absl::Now() + rpc_timeout_;
  absl::Duration persist_idle;
  bool automatic;
  {
    std::lock_guard<std::mutex> lock(persist_mu_);
    persist_idle = persist_idle_;
    automatic = persist_automatic_;
  }
  // Calls through the mux may overlap (a sweep's creates): the mux serves each on a connection
  // of its own, and starting it races safely, as between loomctl processes.
  if (persist_idle > absl::ZeroDuration() && MuxRelays(path)) {
    std::string bytes, answer, note;
    if (!request.SerializeToString(&bytes)) {
      return absl::InternalError("cannot serialize the request");
    }
    // A cancel is not repeated after the mux took it: a second one fails on the cancelled job.
    const bool retry_safe = path != rpc::kCancelJob;
    std::optional<grpc::Status> status =
        CallThroughMux(PersistTarget{server_, tls_, persist_idle, automatic}, path, bytes, token_,
                       deadline, retry_safe, &answer, &note);
    if (!note.empty()) {
      std::lock_guard<std::mutex> lock(persist_mu_);
      if (!persist_warned_ && persist_warnings_ != nullptr) {
        *persist_warnings_ << "loomctl: " << note << "\n";
        persist_warned_ = true;
      }
    }
    if (status.has_value()) {
      if (status->ok() && !response->ParseFromString(answer)) {
        return absl::InternalError("cannot parse the answer's message");
      }
      return FromGrpcStatus(*status);
    }
  }
  std::unique_ptr<WireClient> client = Acquire();
  const grpc::Status status = client->Call(path, request, response, deadline);
  Release(std::move(client));
  return FromGrpcStatus(status);
}

absl::Status Connection::Stream(std::string_view path, const google::protobuf::MessageLite& request,
                                absl::FunctionRef<bool(std::string_view)> on_message) {
  std::unique_ptr<WireClient> client = Acquire();
  const grpc::Status status = client->CallStream(path, request, on_message, absl::InfiniteFuture());
  Release(std::move(client));
  return FromGrpcStatus(status);
}

bool ParseStreamMessage(std::string_view bytes, google::protobuf::MessageLite* out) {
  return out->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
}

}  // namespace loom::client
