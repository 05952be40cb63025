#include "server/rpc/scaling_service.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "server/rpc/call_auth.h"

namespace loom::rpc {
namespace {

// The sweep `name` when `who` may see and act on it (the owning tenant, or an admin).
absl::StatusOr<v1::ScaleTest> Authorized(const auth::Principal& who,
                                         scaling::ScaleTestManager* manager,
                                         const std::string& name) {
  absl::StatusOr<v1::ScaleTest> test = manager->GetScaleTest(name);
  if (!test.ok()) return test.status();
  if (!who.is_admin() && test->tenant() != who.subject) {
    return absl::PermissionDeniedError(
        absl::StrCat(name, " belongs to another tenant; tenant \"", who.subject,
                     "\" can only see and act on its own scale tests (ListScaleTests shows them)"));
  }
  return test;
}

// Hides spec.env values from anyone but the owning tenant (as RedactForeign does for jobs).
void Redact(const auth::Principal& who, v1::ScaleTest* test) {
  if (test->tenant() == who.subject) return;
  for (auto& [name, value] : *test->mutable_spec()->mutable_env()) value = kHiddenEnvValue;
}

}  // namespace

grpc::Status ScalingServiceImpl::CreateScaleTest(grpc::ServerContext* context,
                                                 const v1::CreateScaleTestRequest* request,
                                                 v1::ScaleTest* response) {
  absl::StatusOr<auth::Principal> who = AuthenticatePerson(context, authenticator_);
  if (!who.ok()) return ToGrpcStatus(who.status());
  absl::StatusOr<v1::ScaleTest> test = manager_->CreateScaleTest(*request, who->subject);
  if (!test.ok()) return ToGrpcStatus(test.status());
  *response = *std::move(test);
  return grpc::Status::OK;
}

grpc::Status ScalingServiceImpl::GetScaleTest(grpc::ServerContext* context,
                                              const v1::GetScaleTestRequest* request,
                                              v1::ScaleTest* response) {
  absl::StatusOr<auth::Principal> who = AuthenticatePerson(context, authenticator_);
  if (!who.ok()) return ToGrpcStatus(who.status());
  absl::StatusOr<v1::ScaleTest> test = Authorized(*who, manager_, request->name());
  if (!test.ok()) return ToGrpcStatus(test.status());
  *response = *std::move(test);
  Redact(*who, response);
  return grpc::Status::OK;
}

grpc::Status ScalingServiceImpl::ListScaleTests(grpc::ServerContext* context,
                                                const v1::ListScaleTestsRequest* request,
                                                v1::ListScaleTestsResponse* response) {
  absl::StatusOr<auth::Principal> who = AuthenticatePerson(context, authenticator_);
  if (!who.ok()) return ToGrpcStatus(who.status());
  std::optional<std::string> tenant;
  if (!who->is_admin()) tenant = who->subject;
  absl::StatusOr<v1::ListScaleTestsResponse> page = manager_->ListScaleTests(*request, tenant);
  if (!page.ok()) return ToGrpcStatus(page.status());
  *response = *std::move(page);
  for (v1::ScaleTest& t : *response->mutable_scale_tests()) Redact(*who, &t);
  return grpc::Status::OK;
}

grpc::Status ScalingServiceImpl::CancelScaleTest(grpc::ServerContext* context,
                                                 const v1::CancelScaleTestRequest* request,
                                                 v1::ScaleTest* response) {
  absl::StatusOr<auth::Principal> who = AuthenticatePerson(context, authenticator_);
  if (!who.ok()) return ToGrpcStatus(who.status());
  absl::StatusOr<v1::ScaleTest> found = Authorized(*who, manager_, request->name());
  if (!found.ok()) return ToGrpcStatus(found.status());
  absl::StatusOr<v1::ScaleTest> test = manager_->CancelScaleTest(request->name());
  if (!test.ok()) return ToGrpcStatus(test.status());
  *response = *std::move(test);
  Redact(*who, response);
  return grpc::Status::OK;
}

}  // namespace loom::rpc
