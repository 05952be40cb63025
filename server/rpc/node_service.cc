#include "server/rpc/node_service.h"

#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "server/rpc/call_auth.h"
#include "server/rpc/stream_sink.h"

namespace loom::rpc {
namespace {

// OK when the caller holds a credential for node `node_id` (or loomd authenticates nobody).
absl::Status AuthorizeNode(const grpc::ServerContext* context, auth::Authenticator* authenticator,
                           const std::string& node_id) {
  absl::StatusOr<auth::Principal> who = Authenticate(context, authenticator);
  if (!who.ok()) return who.status();
  if (who->method == "open" || who->may_be_node(node_id)) return absl::OkStatus();
  if (who->role == auth::Role::kNode) {
    return absl::PermissionDeniedError(absl::StrCat(
        "this node credential is for node \"", who->subject.substr(0, 63), "\", not \"",
        node_id.substr(0, 63), "\"; run the worker with --node-id=", who->subject.substr(0, 63)));
  }
  return absl::PermissionDeniedError(
      "registering a node needs a node credential (loom-worker --join-token-file, or a client "
      "certificate named node:NODE_ID); user and admin credentials cannot pose as a worker");
}

// OK for an admin (node management changes what every tenant's jobs run on).
absl::Status AuthorizeAdmin(const grpc::ServerContext* context,
                            auth::Authenticator* authenticator) {
  absl::StatusOr<auth::Principal> who = Authenticate(context, authenticator);
  if (!who.ok()) return who.status();
  if (who->is_admin()) return absl::OkStatus();
  return absl::PermissionDeniedError(
      "draining and deleting nodes is for admins (an `admin` line of loomd's --tokens-file, or a "
      "certificate named admin:NAME)");
}

}  // namespace

grpc::Status NodeServiceImpl::RegisterNode(grpc::ServerContext* context,
                                           const v1::RegisterNodeRequest* request,
                                           v1::RegisterNodeResponse* response) {
  if (absl::Status s = AuthorizeNode(context, authenticator_, request->node_id()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<v1::RegisterNodeResponse> result = manager_->RegisterNode(*request);
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

grpc::Status NodeServiceImpl::ListNodes(grpc::ServerContext* context, const v1::ListNodesRequest*,
                                        v1::ListNodesResponse* response) {
  if (absl::StatusOr<auth::Principal> who = Authenticate(context, authenticator_); !who.ok()) {
    return ToGrpcStatus(who.status());
  }
  *response = manager_->ListNodes();
  return grpc::Status::OK;
}

grpc::Status NodeServiceImpl::DrainNode(grpc::ServerContext* context,
                                        const v1::DrainNodeRequest* request,
                                        v1::Node* response) {
  if (absl::Status s = AuthorizeAdmin(context, authenticator_); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<v1::Node> node = manager_->DrainNode(*request);
  if (!node.ok()) return ToGrpcStatus(node.status());
  *response = std::move(*node);
  return grpc::Status::OK;
}

grpc::Status NodeServiceImpl::DeleteNode(grpc::ServerContext* context,
                                         const v1::DeleteNodeRequest* request,
                                         v1::DeleteNodeResponse*) {
  if (absl::Status s = AuthorizeAdmin(context, authenticator_); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(manager_->DeleteNode(*request));
}

grpc::Status NodeServiceImpl::Session(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) {
  v1::WorkerMessage first;
  if (!stream->Read(&first)) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "the session ended before hello");
  }
  if (!first.has_hello()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "the first message of a session must be hello (after RegisterNode)");
  }
  const std::string node_id = first.hello().node_id();
  if (absl::Status s = AuthorizeNode(context, authenticator_, node_id); !s.ok()) {
    return ToGrpcStatus(s);
  }
  auto sink = std::make_shared<StreamSink>(context);
  absl::StatusOr<uint64_t> session_id = manager_->OpenSession(first.hello(), sink);
  if (!session_id.ok()) return ToGrpcStatus(session_id.status());

  absl::Notification writer_done;
  std::thread writer([&sink, &writer_done, stream] {
    sink->Run(stream);
    writer_done.Notify();
  });
  grpc::Status result = grpc::Status::OK;
  v1::WorkerMessage message;
  while (stream->Read(&message)) {
    absl::Status status = manager_->HandleWorkerMessage(node_id, *session_id, message);
    if (absl::IsFailedPrecondition(status)) {
      result = ToGrpcStatus(status);
      break;
    }
    if (!status.ok()) {
      LOOM_LOG(WARNING) << "nodes/" << node_id << ": bad session message ignored: " << status;
    }
  }
  // Read the reason before finishing: Finish() makes the manager's own Close() a no-op, so
  // closing our session below does not cancel the call we are about to end normally.
  const bool by_loomd = sink->closed_by_loomd();
  sink->Finish();
  manager_->CloseSession(node_id, *session_id);
  // A writer stuck in Write() (a worker that stopped reading) is freed by cancelling the call.
  if (!writer_done.WaitForNotificationWithTimeout(absl::Seconds(1))) context->TryCancel();
  writer.join();
  if (by_loomd && result.ok()) {
    result = grpc::Status(grpc::StatusCode::ABORTED,
                          "loomd ended this session (replaced by a newer session of the node, "
                          "node declared LOST, or shutdown); reconnect with hello");
  }
  return result;
}

}  // namespace loom::rpc
