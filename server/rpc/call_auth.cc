#include "server/rpc/call_auth.h"

#include "absl/strings/str_cat.h"

namespace loom::rpc {

absl::StatusOr<auth::Principal> Authenticate(const grpc::ServerContextBase* context,
                                             auth::Authenticator* authenticator) {
  absl::string_view authorization;
  const auto& metadata = context->client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    authorization = absl::string_view(it->second.data(), it->second.size());
  }
  std::string common_name;
  std::shared_ptr<const grpc::AuthContext> auth_context = context->auth_context();
  if (auth_context != nullptr && auth_context->IsPeerAuthenticated()) {
    // Set only for a client certificate that TLS verified against loomd's --tls-client-ca.
    for (const grpc::string_ref& cn : auth_context->FindPropertyValues("x509_common_name")) {
      common_name.assign(cn.data(), cn.size());
    }
  }
  return authenticator->Authenticate(authorization, common_name);
}

absl::StatusOr<auth::Principal> AuthenticatePerson(const grpc::ServerContextBase* context,
                                                   auth::Authenticator* authenticator) {
  absl::StatusOr<auth::Principal> who = Authenticate(context, authenticator);
  if (!who.ok()) return who.status();
  if (!who->is_person()) {
    return absl::PermissionDeniedError(
        "a node credential cannot use JobService; use a user or admin token (LOOM_TOKEN)");
  }
  return who;
}

std::string TenantOf(const v1::Job& job) {
  return job.tenant().empty() ? std::string(auth::kDefaultTenant) : job.tenant();
}

absl::Status CheckJobAccess(const auth::Principal& who, const v1::Job& job) {
  if (who.is_admin() || TenantOf(job) == who.subject) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(job.name(), " belongs to another tenant; tenant \"", who.subject,
                   "\" can only see and act on its own jobs (ListJobs shows them)"));
}

void RedactForeign(const auth::Principal& who, v1::Job* job) {
  if (TenantOf(*job) == who.subject) return;
  for (auto& [name, value] : *job->mutable_spec()->mutable_env()) value = kHiddenEnvValue;
}

absl::Status AuthorizeNode(const grpc::ServerContextBase* context,
                           auth::Authenticator* authenticator, const std::string& node_id) {
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

}  // namespace loom::rpc
