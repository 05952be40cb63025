// The reference that loomctl's reflective spec setter (common/json_message.h) is checked
// against: protobuf's JSON parser on the same checked JSON. Shared by
// tests/common/spec_yaml_test.cc (chosen specs) and tests/fuzz/spec_yaml_fuzz.cc (any input).
#pragma once

#include <google/protobuf/util/field_comparator.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "loom/v1/job.pb.h"

namespace loom::testing {

// What JobSpecFromYaml(yaml, source, "") would give if it still handed `checked` (the output of
// loom::internal::JobSpecJson for that YAML) to protobuf's JSON parser, or the parser's error.
inline absl::StatusOr<v1::JobSpec> JobSpecByProtobufJsonParser(const nlohmann::json& checked) {
  v1::JobSpec reference;
  const auto status = google::protobuf::util::JsonStringToMessage(checked.dump(), &reference);
  if (!status.ok()) return absl::InvalidArgumentError(std::string(status.message()));
  return reference;
}

// Whether two specs are the same message, a NaN equal to a NaN (`lr: .nan` is a legal spec).
inline bool SameSpec(const v1::JobSpec& a, const v1::JobSpec& b) {
  google::protobuf::util::DefaultFieldComparator comparator;
  comparator.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differencer;
  differencer.set_field_comparator(&comparator);
  return differencer.Compare(a, b);
}

}  // namespace loom::testing
