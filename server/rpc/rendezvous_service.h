// RendezvousService over gRPC: a thin adapter over RendezvousStore. Wait blocks its handler
// thread until the keys are set, the timeout passes or the client cancels.
//
// Every call must carry the secret of its scope in the kRendezvousSecretHeader metadata
// (auth/rendezvous_secrets.h): a rank of one job cannot read or write another job's keys, nor
// its own job's keys of another generation. PERMISSION_DENIED otherwise.
#pragma once

#include <grpcpp/grpcpp.h>

#include "loom/v1/rendezvous.grpc.pb.h"
#include "server/auth/rendezvous_secrets.h"
#include "server/rendezvous/rendezvous_store.h"

namespace loom::rpc {

inline constexpr char kRendezvousSecretHeader[] = "x-loom-rendezvous-secret";

class RendezvousServiceImpl final : public v1::RendezvousService::Service {
 public:
  // Both must outlive the service. `secrets` null: no secret is checked (tests of the store
  // behind the adapter only).
  RendezvousServiceImpl(rendezvous::RendezvousStore* store, const auth::RendezvousSecrets* secrets)
      : store_(store), secrets_(secrets) {}

  grpc::Status Set(grpc::ServerContext* context, const v1::SetRequest* request,
                   v1::SetResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const v1::GetRequest* request,
                   v1::GetResponse* response) override;
  grpc::Status Wait(grpc::ServerContext* context, const v1::WaitRequest* request,
                    v1::WaitResponse* response) override;
  grpc::Status Add(grpc::ServerContext* context, const v1::AddRequest* request,
                   v1::AddResponse* response) override;

 private:
  // OK when the call presents the scope's secret.
  grpc::Status Authorize(const grpc::ServerContext* context,
                         const v1::RendezvousScope& scope) const;

  rendezvous::RendezvousStore* const store_;
  const auth::RendezvousSecrets* const secrets_;
};

}  // namespace loom::rpc
