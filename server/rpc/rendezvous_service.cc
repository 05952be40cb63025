#include "server/rpc/rendezvous_service.h"

#include <string>
#include <vector>

#include "common/grpc_status.h"

namespace loom::rpc {

grpc::Status RendezvousServiceImpl::Authorize(const grpc::ServerContext* context,
                                              const v1::RendezvousScope& scope) const {
  if (secrets_ == nullptr) return grpc::Status::OK;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kRendezvousSecretHeader);
  const absl::string_view presented = it == metadata.end()
                                          ? absl::string_view()
                                          : absl::string_view(it->second.data(), it->second.size());
  if (presented.empty()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "rendezvous calls need the gang's secret (LOOM_RENDEZVOUS_SECRET, set by "
                        "loom-worker) in the x-loom-rendezvous-secret metadata");
  }
  if (!secrets_->Check(scope.job(), scope.generation(), presented)) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "the rendezvous secret does not open this scope: a rank may only use its "
                        "own job and generation (LOOM_JOB, LOOM_JOB_GENERATION)");
  }
  return grpc::Status::OK;
}

grpc::Status RendezvousServiceImpl::Set(grpc::ServerContext* context, const v1::SetRequest* request,
                                        v1::SetResponse*) {
  if (grpc::Status s = Authorize(context, request->scope()); !s.ok()) return s;
  return ToGrpcStatus(store_->Set(request->scope(), request->key(), request->value()));
}

grpc::Status RendezvousServiceImpl::Get(grpc::ServerContext* context, const v1::GetRequest* request,
                                        v1::GetResponse* response) {
  if (grpc::Status s = Authorize(context, request->scope()); !s.ok()) return s;
  absl::StatusOr<std::string> value = store_->Get(request->scope(), request->key());
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(std::move(*value));
  return grpc::Status::OK;
}

grpc::Status RendezvousServiceImpl::Wait(grpc::ServerContext* context,
                                         const v1::WaitRequest* request,
                                         v1::WaitResponse* response) {
  if (grpc::Status s = Authorize(context, request->scope()); !s.ok()) return s;
  const std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  absl::StatusOr<std::vector<std::string>> values =
      store_->Wait(request->scope(), keys, absl::Milliseconds(request->timeout_ms()),
                   [context] { return context->IsCancelled(); });
  if (!values.ok()) return ToGrpcStatus(values.status());
  for (std::string& value : *values) response->add_values(std::move(value));
  return grpc::Status::OK;
}

grpc::Status RendezvousServiceImpl::Add(grpc::ServerContext* context, const v1::AddRequest* request,
                                        v1::AddResponse* response) {
  if (grpc::Status s = Authorize(context, request->scope()); !s.ok()) return s;
  absl::StatusOr<int64_t> value = store_->Add(request->scope(), request->key(), request->delta());
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*value);
  return grpc::Status::OK;
}

}  // namespace loom::rpc
