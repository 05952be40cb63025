// Fuzz target: loomctl's job spec reader (client/spec_yaml.cc and client/yaml_json.cc), YAML
// text to JobSpec, and the YAML <-> JSON bridge. Contracts: never a crash and never an
// exception out of these functions (yaml-cpp throws; yaml_json.h promises to catch);
// JsonToYaml output reads back as the same JSON (yaml_json.h: "the output round-trips").
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "client/spec_yaml.h"
#include "client/yaml_json.h"

namespace {

// NaN is the one JSON value (here: a YAML .nan) not equal to itself.
bool HasNan(const nlohmann::json& j) {
  if (j.is_number_float()) return std::isnan(j.get<double>());
  if (j.is_structured()) {
    for (const auto& item : j) {
      if (HasNan(item)) return true;
    }
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)loom::client::JobSpecFromYaml(text, "fuzz.yaml", "/base");

  absl::StatusOr<YAML::Node> node = loom::client::ParseYamlDocument(text, "fuzz.yaml");
  if (!node.ok()) return 0;
  const nlohmann::json json = loom::client::YamlToJson(*node);
  if (HasNan(json)) return 0;
  std::string dumped;
  try {
    dumped = json.dump();
  } catch (const nlohmann::json::type_error&) {
    return 0;  // not UTF-8: YAML may hold any bytes, JSON may not (JobSpecFromYaml refuses it)
  }
  // U+FFFE and U+FFFF are not printable in YAML and yaml-cpp 0.7's emitter writes them as
  // U+FFFD instead of escaping them: a limit of the library, for characters no spec needs.
  if (dumped.find("\xEF\xBF\xBE") != std::string::npos ||
      dumped.find("\xEF\xBF\xBF") != std::string::npos) {
    return 0;
  }
  const std::string yaml = loom::client::JsonToYaml(nlohmann::ordered_json::parse(dumped));
  absl::StatusOr<YAML::Node> back = loom::client::ParseYamlDocument(yaml, "round-trip.yaml");
  if (!back.ok()) {
    std::fprintf(stderr, "JsonToYaml wrote YAML that does not parse: %s\n--- yaml ---\n%s\n",
                 std::string(back.status().message()).c_str(), yaml.c_str());
    std::abort();
  }
  const nlohmann::json again = loom::client::YamlToJson(*back);
  if (again != json) {
    std::fprintf(stderr,
                 "round trip changed the value\n--- json ---\n%s\n--- yaml ---\n%s\n"
                 "--- back ---\n%s\n",
                 json.dump().c_str(), yaml.c_str(), again.dump().c_str());
    std::abort();
  }
  return 0;
}
