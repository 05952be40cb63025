// NodeService over gRPC: a thin adapter from workers to JobManager.
//
// Session design (sync API): the handler thread is the session's reader. It reads `hello`,
// opens the session in the manager with a StreamSink, and then hands every message to the
// manager. The downward half is a StreamSink: the manager queues CoordinatorMessages into it
// without blocking (it holds its lock while it does), and a writer thread owned by the handler
// drains the queue into the stream. Sync streams allow one reader and one writer at a time, so
// this is safe, and a slow worker never blocks the manager. When the manager ends a session
// (a newer session replaced it, the node was declared LOST, loomd shuts down) the sink cancels
// the call, which wakes the reader; the handler then joins the writer and returns.
#pragma once

#include <grpcpp/grpcpp.h>

#include "loom/v1/node.grpc.pb.h"
#include "server/auth/authenticator.h"
#include "server/jobs/job_manager.h"

namespace loom::rpc {

class NodeServiceImpl final : public v1::NodeService::Service {
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
  grpc::Status Session(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) override;

 private:
  jobs::JobManager* const manager_;
  auth::Authenticator* const authenticator_;
};

}  // namespace loom::rpc
