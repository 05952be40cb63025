#include "client/connection.h"

#include <arpa/inet.h>

#include <chrono>
#include <cstdlib>

#include "common/net.h"
#include "common/tls.h"

namespace loom::client {
namespace {

// The channel target for `server`: an IP literal goes to gRPC's address resolver ("ipv4:" or
// "ipv6:"), which takes it as it is, instead of the DNS resolver, whose lookup runs on a
// resolver thread even for a literal and costs a CLI call about a millisecond. The authority
// stays "host:port", as with the plain target, so TLS checks the same name.
std::string ChannelTarget(const std::string& server, grpc::ChannelArguments* args) {
  absl::StatusOr<HostPort> hp = ParseHostPort(server);
  if (!hp.ok()) return server;  // gRPC reports what it cannot use
  unsigned char addr[16];
  const char* scheme = ::inet_pton(AF_INET, hp->host.c_str(), addr) == 1    ? "ipv4:"
                       : ::inet_pton(AF_INET6, hp->host.c_str(), addr) == 1 ? "ipv6:"
                                                                            : nullptr;
  if (scheme == nullptr) return server;
  args->SetString(GRPC_ARG_DEFAULT_AUTHORITY, FormatHostPort(*hp));
  return std::string(scheme) + FormatHostPort(*hp);
}

}  // namespace

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
  const std::string target = ChannelTarget(server_, &args);
  channel_ = grpc::CreateCustomChannel(target, credentials, args);
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
