// Conversions between YAML node trees and JSON values, the bridge between what people write
// (YAML) and the protobuf JSON mapping (the one schema of the API).
//
// YAML scalars are typed by the YAML 1.2 core schema: a plain (unquoted) scalar that reads as an
// integer, a float, a boolean or null becomes that JSON type; quoted scalars always stay strings.
// Maps become objects (`{}` stays an empty object) and sequences arrays.
//
// These functions use yaml-cpp, which reports errors by throwing. They never throw: the one
// place that catches yaml-cpp's exceptions for the client is ParseYamlDocument (below), and
// node accessors used here cannot throw on nodes it returned.
#pragma once

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loom {

// Parses exactly one YAML document. `source_name` (a file name, or "<stdin>") prefixes every
// error, which names the 1-based line and column: "job.yaml:3:7: YAML syntax error: ...".
// An empty document is returned as a Null node.
absl::StatusOr<YAML::Node> ParseYamlDocument(absl::string_view text, absl::string_view source_name);

// The typed value of a plain scalar per the YAML 1.2 core schema, or nullopt when it is text.
// Integers: [-+]?[0-9]+, 0x[0-9a-fA-F]+, 0o[0-7]+ (that fit in int64; larger ones are floats).
// Floats: decimal/exponent forms, .inf, -.inf, .nan. Booleans: true/True/TRUE/false/...
// Null: "", ~, null/Null/NULL.
std::optional<nlohmann::json> TypedPlainScalar(absl::string_view text);

// Whether `node` is a scalar written without quotes (so TypedPlainScalar applies to it).
bool IsPlainScalar(const YAML::Node& node);

// Converts a whole tree, typing scalars as described above. Map keys become their text.
nlohmann::json YamlToJson(const YAML::Node& node);

// Renders a JSON value as block-style YAML (used for `-o yaml`). Strings that YAML would read
// back as another type (e.g. "12", "true", "") are quoted so that the output round-trips.
std::string JsonToYaml(const nlohmann::ordered_json& value);

}  // namespace loom
