#include "server/rpc/node_service.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "server/rpc/call_auth.h"
#include "server/rpc/session_reactor.h"

namespace loom::rpc {
namespace {

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
  absl::StatusOr<auth::Principal> who = Authenticate(context, authenticator_);
  if (!who.ok()) return ToGrpcStatus(who.status());
  *response = manager_->ListNodes(/*with_quarantined=*/who->is_admin());
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

grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* NodeServiceImpl::Session(
    grpc::CallbackServerContext* context) {
  return SessionReactor::Start(context, manager_, authenticator_);
}

}  // namespace loom::rpc
