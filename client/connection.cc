#include "client/connection.h"

#include <chrono>
#include <cstdlib>

#include "common/tls.h"

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

Connection::Connection(std::string server, absl::Duration rpc_timeout)
    : Connection(std::move(server), rpc_timeout, grpc::InsecureChannelCredentials(), "") {}

Connection::Connection(std::string server, absl::Duration rpc_timeout,
                       std::shared_ptr<grpc::ChannelCredentials> credentials, std::string token)
    : server_(std::move(server)), rpc_timeout_(rpc_timeout), token_(std::move(token)) {
  grpc::ChannelArguments args;
  // Large job lists and log pages: accept what loomd may send.
  args.SetMaxReceiveMessageSize(64 << 20);
  channel_ = grpc::CreateCustomChannel(server_, credentials, args);
  jobs_ = loom::v1::JobService::NewStub(channel_);
  nodes_ = loom::v1::NodeService::NewStub(channel_);
  scaling_ = loom::v1::ScalingService::NewStub(channel_);
}

void Connection::PrepareStream(grpc::ClientContext* context) const {
  if (!token_.empty()) context->AddMetadata("authorization", "Bearer " + token_);
}

void Connection::PrepareUnary(grpc::ClientContext* context) const {
  PrepareStream(context);
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(rpc_timeout_));
}

}  // namespace loom::client
