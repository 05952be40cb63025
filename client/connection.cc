#include "client/connection.h"

#include <arpa/inet.h>

#include <chrono>
#include <cstdlib>

#include "client/persist_mux.h"
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

Connection::Connection(std::string server, absl::Duration rpc_timeout, std::string token,
                       UnaryTransport transport)
    : server_(std::move(server)), rpc_timeout_(rpc_timeout), token_(std::move(token)) {
  if (transport == UnaryTransport::kWire) wire_ = std::make_unique<WireClient>(server_, token_);
}

Connection::Connection(std::string server, absl::Duration rpc_timeout,
                       std::shared_ptr<grpc::ChannelCredentials> credentials, std::string token)
    : server_(std::move(server)),
      rpc_timeout_(rpc_timeout),
      token_(std::move(token)),
      make_credentials_([credentials = std::move(credentials)] { return credentials; }) {}

Connection::Connection(std::string server, absl::Duration rpc_timeout, std::string token,
                       WireTls wire_tls,
                       std::function<std::shared_ptr<grpc::ChannelCredentials>()> make_credentials)
    : server_(std::move(server)),
      rpc_timeout_(rpc_timeout),
      token_(std::move(token)),
      make_credentials_(std::move(make_credentials)),
      wire_(std::make_unique<WireClient>(server_, token_, wire_tls)),
      wire_tls_(std::move(wire_tls)) {}

void Connection::UsePersistentConnection(absl::Duration idle, std::ostream* warnings) {
  persist_idle_ = idle;
  persist_warnings_ = warnings;
}

Connection::~Connection() = default;

void Connection::MakeChannel() {
  std::call_once(channel_once_, [this] {
    grpc::ChannelArguments args;
    // Large job lists and log pages: accept what loomd may send.
    args.SetMaxReceiveMessageSize(kWireMaxResponseBytes);
    const std::string target = ChannelTarget(server_, &args);
    channel_ = grpc::CreateCustomChannel(
        target, make_credentials_ ? make_credentials_() : grpc::InsecureChannelCredentials(), args);
    jobs_ = loom::v1::JobService::NewStub(channel_);
    nodes_ = loom::v1::NodeService::NewStub(channel_);
    scaling_ = loom::v1::ScalingService::NewStub(channel_);
  });
}

loom::v1::JobService::StubInterface& Connection::jobs() {
  MakeChannel();
  return *jobs_;
}
loom::v1::NodeService::StubInterface& Connection::nodes() {
  MakeChannel();
  return *nodes_;
}
loom::v1::ScalingService::StubInterface& Connection::scaling() {
  MakeChannel();
  return *scaling_;
}

template <typename Request, typename Response>
grpc::Status Connection::Unary(std::string_view path,
                               grpc::Status (loom::v1::JobService::StubInterface::*stub_method)(
                                   grpc::ClientContext*, const Request&, Response*),
                               grpc::ClientContext* context, const Request& request,
                               Response* response) {
  if (wire_ == nullptr) return (jobs().*stub_method)(context, request, response);
  std::lock_guard<std::mutex> lock(wire_mu_);
  const absl::Time deadline = absl::FromChrono(context->deadline());
  if (persist_idle_ > absl::ZeroDuration()) {
    std::string bytes, answer, note;
    if (!request.SerializeToString(&bytes)) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "cannot serialize the request");
    }
    // A cancel is not repeated after the mux took it: a second one fails on the cancelled job.
    const bool retry_safe = path != "/loom.v1.JobService/CancelJob";
    std::optional<grpc::Status> status =
        CallThroughMux(PersistTarget{server_, wire_tls_, persist_idle_}, path, bytes, token_,
                       deadline, retry_safe, &answer, &note);
    if (!note.empty() && !persist_warned_ && persist_warnings_ != nullptr) {
      *persist_warnings_ << "loomctl: " << note << "\n";
      persist_warned_ = true;
    }
    if (status.has_value()) {
      if (status->ok() && !response->ParseFromString(answer)) {
        return grpc::Status(grpc::StatusCode::INTERNAL, "cannot parse the answer's message");
      }
      return *status;
    }
  }
  return wire_->Call(path, request, response, deadline);
}

grpc::Status Connection::CreateJob(grpc::ClientContext* context,
                                   const loom::v1::CreateJobRequest& request,
                                   loom::v1::Job* response) {
  return Unary("/loom.v1.JobService/CreateJob", &loom::v1::JobService::StubInterface::CreateJob,
               context, request, response);
}

grpc::Status Connection::GetJob(grpc::ClientContext* context,
                                const loom::v1::GetJobRequest& request, loom::v1::Job* response) {
  return Unary("/loom.v1.JobService/GetJob", &loom::v1::JobService::StubInterface::GetJob, context,
               request, response);
}

grpc::Status Connection::ListJobs(grpc::ClientContext* context,
                                  const loom::v1::ListJobsRequest& request,
                                  loom::v1::ListJobsResponse* response) {
  return Unary("/loom.v1.JobService/ListJobs", &loom::v1::JobService::StubInterface::ListJobs,
               context, request, response);
}

grpc::Status Connection::CancelJob(grpc::ClientContext* context,
                                   const loom::v1::CancelJobRequest& request,
                                   loom::v1::Job* response) {
  return Unary("/loom.v1.JobService/CancelJob", &loom::v1::JobService::StubInterface::CancelJob,
               context, request, response);
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
