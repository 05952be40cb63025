// RendezvousService over gRPC: a thin adapter over RendezvousStore. Wait blocks its handler
// thread until the keys are set, the timeout passes or the client cancels.
#pragma once

#include <grpcpp/grpcpp.h>

#include "loom/v1/rendezvous.grpc.pb.h"
#include "server/rendezvous/rendezvous_store.h"

namespace loom::rpc {

class RendezvousServiceImpl final : public v1::RendezvousService::Service {
 public:
  // `store` must outlive the service.
  explicit RendezvousServiceImpl(rendezvous::RendezvousStore* store) : store_(store) {}

  grpc::Status Set(grpc::ServerContext* context, const v1::SetRequest* request,
                   v1::SetResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const v1::GetRequest* request,
                   v1::GetResponse* response) override;
  grpc::Status Wait(grpc::ServerContext* context, const v1::WaitRequest* request,
                    v1::WaitResponse* response) override;
  grpc::Status Add(grpc::ServerContext* context, const v1::AddRequest* request,
                   v1::AddResponse* response) override;

 private:
  rendezvous::RendezvousStore* const store_;
};

}  // namespace loom::rpc
