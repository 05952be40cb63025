// Prints a protobuf message as JSON by reflection, in protobuf's JSON mapping with the fields'
// proto (snake_case) names, and every field without presence printed even at its default.
//
// Why not google::protobuf::util::MessageToJsonString (with preserve_proto_field_names and
// always_print_primitive_fields, which this matches): protobuf 3.21's printer serializes the
// message and re-reads the bytes through a type resolver. That was 7 % of loom-worker's CPU in
// `perf` with back-to-back gangs (about 0.1 ms a gang on a 2-core VM), spent on each gang's
// spec.json between one gang's end and the next one's start. tests/common/proto_json_test.cc checks
// that both print the same JSON values for specs with every field set, none set, and each optional
// field alone.
//
// The mapping: int32/uint32/float/double/bool as JSON numbers and booleans (a non-finite double
// as "NaN", "Infinity" or "-Infinity"); int64/uint64 as decimal strings; enums by value name
// (the number when the value has no name); strings as UTF-8 (invalid bytes replaced, which
// proto3 parsing never lets through); bytes as base64; repeated fields as arrays; maps as
// objects keyed by the key's text; message fields, and fields with presence (proto3 optional,
// oneof members), only when set; well-known types (google.protobuf.*) are not specially
// mapped, so the caller's message must not contain them.
#pragma once

#include <google/protobuf/message.h>

#include <string>

namespace loom {

// The JSON text of `message`, indented by two spaces.
std::string MessageToJson(const google::protobuf::Message& message);

}  // namespace loom
