// `-o table|json|yaml`: how loomctl prints API objects. json is the protobuf JSON mapping
// (lowerCamelCase keys, enums by name, int64 as strings, every field printed even when it holds
// its default so that scripts can rely on the keys); yaml is that same JSON rendered as YAML.
#pragma once

#include <google/protobuf/message.h>

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom::client {

enum class OutputFormat { kTable, kJson, kYaml };

// "table", "json" or "yaml"; INVALID_ARGUMENT naming -o otherwise.
absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text);

// The protobuf JSON mapping of `message` as a JSON value, keys in field order.
nlohmann::ordered_json MessageToJsonValue(const google::protobuf::Message& message);

// `message` rendered for kJson (indented, or one line when `compact`) or kYaml (one YAML
// document). Ends with a newline. kTable is not handled here (each command has its own table).
std::string RenderMessage(const google::protobuf::Message& message, OutputFormat format,
                          bool compact = false);

}  // namespace loom::client
