#include "tests/integration/grpc_probe.h"

#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/impl/codegen/rpc_method.h>
#include <grpcpp/impl/codegen/sync_stream.h>
#include <grpcpp/support/byte_buffer.h>

#include <chrono>

#include "absl/status/status.h"
#include "common/grpc_status.h"

namespace loom::testing {
namespace {

using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string FromBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// A length-delimited protobuf field: tag, varint length, bytes (lengths < 128 only).
std::string LengthDelimited(int field, const std::string& value) {
  std::string out;
  out.push_back(static_cast<char>((field << 3) | 2));
  out.push_back(static_cast<char>(value.size()));
  return out + value;
}

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

}  // namespace

absl::StatusOr<int> HealthCheck(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& service) {
  const grpc::internal::RpcMethod method("/grpc.health.v1.Health/Check",
                                         grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::ClientContext context;
  SetDeadline(&context);
  // HealthCheckRequest { string service = 1; }
  const grpc::ByteBuffer request =
      ToBuffer(service.empty() ? std::string() : LengthDelimited(1, service));
  grpc::ByteBuffer response;
  const grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(), method, &context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  // HealthCheckResponse { ServingStatus status = 1; }
  UnknownFieldSet fields;
  if (!fields.ParseFromString(FromBuffer(response))) {
    return absl::InternalError("HealthCheckResponse does not parse");
  }
  for (int i = 0; i < fields.field_count(); ++i) {
    if (fields.field(i).number() == 1 && fields.field(i).type() == UnknownField::TYPE_VARINT) {
      return static_cast<int>(fields.field(i).varint());
    }
  }
  return 0;  // UNKNOWN, the default value, is not on the wire
}

absl::StatusOr<std::vector<std::string>> ReflectionListServices(
    const std::shared_ptr<grpc::Channel>& channel) {
  const grpc::internal::RpcMethod method(
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      grpc::internal::RpcMethod::BIDI_STREAMING);
  grpc::ClientContext context;
  SetDeadline(&context);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel.get(), method, &context));
  // ServerReflectionRequest { oneof { string list_services = 7; } }
  stream->Write(ToBuffer(LengthDelimited(7, "")));
  stream->WritesDone();
  std::vector<std::string> names;
  grpc::ByteBuffer buffer;
  while (stream->Read(&buffer)) {
    // ServerReflectionResponse { ListServiceResponse list_services_response = 6; }
    // ListServiceResponse { repeated ServiceResponse service = 1; }
    // ServiceResponse { string name = 1; }
    UnknownFieldSet response;
    if (!response.ParseFromString(FromBuffer(buffer))) continue;
    for (int i = 0; i < response.field_count(); ++i) {
      if (response.field(i).number() != 6) continue;
      UnknownFieldSet list;
      if (!list.ParseFromString(response.field(i).length_delimited())) continue;
      for (int j = 0; j < list.field_count(); ++j) {
        if (list.field(j).number() != 1) continue;
        UnknownFieldSet service;
        if (!service.ParseFromString(list.field(j).length_delimited())) continue;
        for (int k = 0; k < service.field_count(); ++k) {
          if (service.field(k).number() == 1) names.push_back(service.field(k).length_delimited());
        }
      }
    }
  }
  const grpc::Status status = stream->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  return names;
}

}  // namespace loom::testing
