// The job spec as people write it: YAML whose keys are the proto's field names, in either the
// JSON (lowerCamelCase) or the proto (snake_case) spelling. There is one schema, the proto:
// the YAML tree is checked against the JobSpec descriptor (so that an unknown key or a wrong
// type is reported with its key path and line), converted to checked JSON, and set into the
// message by reflection (json_message.h), with the result protobuf's JSON parser would give.
//
// Typing: values of string fields (including `env` values) take the scalar's text as written,
// so `env: {STEPS: 5}` and `name: 2024` work; numbers, booleans and enums must be what the field
// expects. An empty value (`auto:`) of a message field means the empty message `{}`; an empty
// value of a scalar field leaves the field unset.
//
// Errors are INVALID_ARGUMENT with "<file>:<line>:<column>: <key path>: <problem>; <fix>".
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "loom/v1/job.pb.h"

namespace loom {

// Converts YAML text to a JobSpec. `source_name` names the text in errors. When `base_dir` is
// not empty, relative data.path, data.val_path and checkpoint.dir are resolved against it
// (lexically; the files need not exist here, loomd checks them).
absl::StatusOr<loom::v1::JobSpec> JobSpecFromYaml(absl::string_view yaml,
                                                  absl::string_view source_name,
                                                  const std::filesystem::path& base_dir);

// Reads `path` ("-" reads standard input) without parsing it: the text, the name errors use for
// it (the path, or "<stdin>"), and the absolute directory its relative paths are resolved
// against (the file's directory; the working directory for standard input). NOT_FOUND names
// the file when it cannot be read; INVALID_ARGUMENT when it is over the size limit (1 MiB; only
// that much is read).
absl::StatusOr<loom::v1::JobSpecYaml> ReadJobSpecFile(const std::string& path);

// Converts what ReadJobSpecFile read, or what a client sent as CreateJobRequest.spec_yaml
// (untrusted: source and base_dir are checked as job.proto says, INVALID_ARGUMENT naming the
// field), with JobSpecFromYaml.
absl::StatusOr<loom::v1::JobSpec> JobSpecFromYamlMessage(const loom::v1::JobSpecYaml& yaml);

// ReadJobSpecFile, then JobSpecFromYamlMessage.
absl::StatusOr<loom::v1::JobSpec> LoadJobSpecFile(const std::string& path);

namespace internal {

// The checked JSON that JobSpecFromYaml sets the JobSpec from (paths not yet resolved), or its
// error. For tests that compare JobSpecFromYaml with protobuf's JSON parser on the same JSON.
absl::StatusOr<nlohmann::json> JobSpecJson(absl::string_view yaml, absl::string_view source_name);

}  // namespace internal

}  // namespace loom
