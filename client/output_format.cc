#include "client/output_format.h"

#include <google/protobuf/util/json_util.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/yaml_json.h"

namespace loom::client {

absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text) {
  if (text == "table") return OutputFormat::kTable;
  if (text == "json") return OutputFormat::kJson;
  if (text == "yaml") return OutputFormat::kYaml;
  return absl::InvalidArgumentError(
      absl::StrCat("-o/--output: unknown format '", text, "'; use table, json or yaml"));
}

nlohmann::ordered_json MessageToJsonValue(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.always_print_enums_as_ints = false;
  std::string text;
  // Serialising a valid in-memory message cannot fail; an empty object is the safe fallback.
  if (!google::protobuf::util::MessageToJsonString(message, &text, options).ok()) return {};
  return nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
}

std::string RenderMessage(const google::protobuf::Message& message, OutputFormat format,
                          bool compact) {
  const nlohmann::ordered_json value = MessageToJsonValue(message);
  if (format == OutputFormat::kYaml) {
    return JsonToYaml(value);
  }
  // Replace, never throw, on invalid UTF-8 (log text comes from user programs).
  return value.dump(compact ? -1 : 2, ' ', false,
                    nlohmann::ordered_json::error_handler_t::replace) +
         "\n";
}

}  // namespace loom::client
