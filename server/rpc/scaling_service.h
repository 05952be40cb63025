// ScalingService over gRPC: a thin adapter from the wire to ScaleTestManager
// (server/scaling). Every call is authenticated as a person (call_auth.h); a sweep belongs to
// the tenant that created it, exactly like a job: another tenant gets PERMISSION_DENIED and does
// not see it in lists; an admin sees and cancels every sweep.
#pragma once

#include <grpcpp/grpcpp.h>

#include "loom/v1/scaling.grpc.pb.h"
#include "server/auth/authenticator.h"
#include "server/scaling/scale_test_manager.h"

namespace loom::rpc {

class ScalingServiceImpl final : public v1::ScalingService::Service {
 public:
  // Both pointers must outlive the service.
  ScalingServiceImpl(scaling::ScaleTestManager* manager, auth::Authenticator* authenticator)
      : manager_(manager), authenticator_(authenticator) {}

  grpc::Status CreateScaleTest(grpc::ServerContext* context,
                               const v1::CreateScaleTestRequest* request,
                               v1::ScaleTest* response) override;
  grpc::Status GetScaleTest(grpc::ServerContext* context, const v1::GetScaleTestRequest* request,
                            v1::ScaleTest* response) override;
  grpc::Status ListScaleTests(grpc::ServerContext* context,
                              const v1::ListScaleTestsRequest* request,
                              v1::ListScaleTestsResponse* response) override;
  grpc::Status CancelScaleTest(grpc::ServerContext* context,
                               const v1::CancelScaleTestRequest* request,
                               v1::ScaleTest* response) override;

 private:
  scaling::ScaleTestManager* const manager_;
  auth::Authenticator* const authenticator_;
};

}  // namespace loom::rpc
