#include "server/rpc/rendezvous_service.h"

#include <string>
#include <vector>

#include "common/grpc_status.h"

namespace loom::rpc {

grpc::Status RendezvousServiceImpl::Set(grpc::ServerContext*, const v1::SetRequest* request,
                                        v1::SetResponse*) {
  return ToGrpcStatus(store_->Set(request->scope(), request->key(), request->value()));
}

grpc::Status RendezvousServiceImpl::Get(grpc::ServerContext*, const v1::GetRequest* request,
                                        v1::GetResponse* response) {
  absl::StatusOr<std::string> value = store_->Get(request->scope(), request->key());
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(std::move(*value));
  return grpc::Status::OK;
}

grpc::Status RendezvousServiceImpl::Wait(grpc::ServerContext* context,
                                         const v1::WaitRequest* request,
                                         v1::WaitResponse* response) {
  const std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  absl::StatusOr<std::vector<std::string>> values =
      store_->Wait(request->scope(), keys, absl::Milliseconds(request->timeout_ms()),
                   [context] { return context->IsCancelled(); });
  if (!values.ok()) return ToGrpcStatus(values.status());
  for (std::string& value : *values) response->add_values(std::move(value));
  return grpc::Status::OK;
}

grpc::Status RendezvousServiceImpl::Add(grpc::ServerContext*, const v1::AddRequest* request,
                                        v1::AddResponse* response) {
  absl::StatusOr<int64_t> value = store_->Add(request->scope(), request->key(), request->delta());
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*value);
  return grpc::Status::OK;
}

}  // namespace loom::rpc
