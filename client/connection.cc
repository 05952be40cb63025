#include "client/connection.h"

#include <chrono>
#include <cstdlib>

namespace loom::client {

std::string ResolveServerAddress(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("LOOM_SERVER");
  if (env != nullptr && env[0] != '\0') return env;
  return kDefaultServer;
}

Connection::Connection(std::string server, absl::Duration rpc_timeout)
    : server_(std::move(server)), rpc_timeout_(rpc_timeout) {
  grpc::ChannelArguments args;
  // Large job lists and log pages: accept what loomd may send.
  args.SetMaxReceiveMessageSize(64 << 20);
  channel_ = grpc::CreateCustomChannel(server_, grpc::InsecureChannelCredentials(), args);
  jobs_ = loom::v1::JobService::NewStub(channel_);
  nodes_ = loom::v1::NodeService::NewStub(channel_);
}

void Connection::PrepareUnary(grpc::ClientContext* context) const {
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(rpc_timeout_));
}

}  // namespace loom::client
