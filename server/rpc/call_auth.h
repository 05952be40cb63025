// Authentication and authorization of one gRPC call, for the adapters: who is calling (from the
// call's "authorization" metadata and the client certificate TLS verified), and the rules that
// keep tenants apart.
//
// Rules (DESIGN.md, "Security"):
//  - JobService: users and admins only. A job belongs to the tenant that created it; another
//    tenant gets PERMISSION_DENIED for get/watch/logs/cancel and does not see it in lists; an
//    admin sees and cancels every job. `spec.env` values are returned to the owning tenant only
//    (an admin sees another tenant's env names with the values hidden).
//  - NodeService: RegisterNode and Session need a node credential for that node id; ListNodes
//    any authenticated caller; node management admins only.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/statusor.h"
#include "loom/v1/job.pb.h"
#include "server/auth/authenticator.h"

namespace loom::rpc {

inline constexpr char kHiddenEnvValue[] = "(hidden: another tenant's value)";

// The caller, or UNAUTHENTICATED.
absl::StatusOr<auth::Principal> Authenticate(const grpc::ServerContextBase* context,
                                             auth::Authenticator* authenticator);
// A user or an admin, or PERMISSION_DENIED (a node credential used for JobService).
absl::StatusOr<auth::Principal> AuthenticatePerson(const grpc::ServerContextBase* context,
                                                   auth::Authenticator* authenticator);

// OK when the caller holds a credential for node `node_id` (or loomd authenticates nobody);
// PERMISSION_DENIED naming the fix otherwise (RegisterNode and Session).
absl::Status AuthorizeNode(const grpc::ServerContextBase* context,
                           auth::Authenticator* authenticator, const std::string& node_id);

// The tenant that owns `job` ("default" for jobs stored before tenants existed).
std::string TenantOf(const v1::Job& job);
// OK when `who` may see and act on `job`; PERMISSION_DENIED naming the job otherwise.
absl::Status CheckJobAccess(const auth::Principal& who, const v1::Job& job);
// Hides `spec.env` values from anyone but the owning tenant.
void RedactForeign(const auth::Principal& who, v1::Job* job);

}  // namespace loom::rpc
