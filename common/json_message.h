// Sets a protobuf message from JSON that has already been checked against the message's
// descriptor, by reflection, field by field.
//
// Why not google::protobuf::util::JsonStringToMessage: loomctl converts one job spec per
// process, and protobuf 3.21's JSON parser cost that one call 0.19-0.28 ms (timed inside
// loomctl); a submit is about 3.5 ms of CPU. The spec reader
// (spec_yaml.cc) has already checked every key and value, so nothing is left to parse. Measured
// side by side over 300 alternating submits, loomctl's CPU fell by about 0.1 ms (median).
// tests/common/spec_yaml_test.cc and the spec_yaml fuzz target check that the result equals
// JsonStringToMessage's on the same JSON, and that both accept and refuse the same inputs.
#pragma once

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"

namespace loom {

// The field of `d` named `key` in its proto (snake_case) or JSON (lowerCamelCase) spelling, or
// null. Both the spec reader and the setter below accept either spelling.
const google::protobuf::FieldDescriptor* FieldByEitherName(const google::protobuf::Descriptor* d,
                                                           const std::string& key);

// Sets the fields of `message` named by `tree`, which must be what spec_yaml.cc's converter
// writes for `message`'s type: a JSON object whose keys are field names (JSON or proto
// spelling); integers as JSON integers in the field's range; doubles as numbers or the strings
// "NaN", "Infinity" and "-Infinity"; enums by value name; maps as objects; repeated fields as
// arrays; well-known types (google.protobuf.*) in their JSON form, which goes through protobuf's
// JSON parser. `message` is not cleared first. Returns INVALID_ARGUMENT, naming the field path,
// for what such JSON can still get wrong: a value of the wrong JSON type, an enum name the type
// lacks, a float outside float's range, a map key that is not of the key's type, a second member
// of one oneof. On error `message` may be partly set.
absl::Status SetMessageFromCheckedJson(const nlohmann::json& tree,
                                       google::protobuf::Message* message);

}  // namespace loom
