// NodeService over gRPC: a thin adapter from workers to JobManager.
//
// Threading: the unary methods use the sync gRPC API (each call runs on a gRPC handler thread).
// Session uses the callback API (session_reactor.h): an open session holds no thread, so the
// number of workers does not set loomd's thread count.
#pragma once

#include <grpcpp/grpcpp.h>

#include "loom/v1/node.grpc.pb.h"
#include "server/auth/authenticator.h"
#include "server/jobs/job_manager.h"

namespace loom::rpc {

class NodeServiceImpl final
    : public v1::NodeService::WithCallbackMethod_Session<v1::NodeService::Service> {
 public:
  // `manager` must outlive the service.
  // Both must outlive the service. RegisterNode and Session need a node credential for the
  // node id (call_auth.h); ListNodes any authenticated caller.
  NodeServiceImpl(jobs::JobManager* manager, auth::Authenticator* authenticator)
      : manager_(manager), authenticator_(authenticator) {}

  grpc::Status RegisterNode(grpc::ServerContext* context, const v1::RegisterNodeRequest* request,
                            v1::RegisterNodeResponse* response) override;
  grpc::Status ListNodes(grpc::ServerContext* context, const v1::ListNodesRequest* request,
                         v1::ListNodesResponse* response) override;
  grpc::Status DrainNode(grpc::ServerContext* context, const v1::DrainNodeRequest* request,
                         v1::Node* response) override;
  grpc::Status DeleteNode(grpc::ServerContext* context, const v1::DeleteNodeRequest* request,
                          v1::DeleteNodeResponse* response) override;
  // One worker's session: `hello` first, then status up and assignments down (SessionReactor).
  grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* Session(
      grpc::CallbackServerContext* context) override;

 private:
  jobs::JobManager* const manager_;
  auth::Authenticator* const authenticator_;
};

}  // namespace loom::rpc
