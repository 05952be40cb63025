// Fuzz target: the training core's own spec reader (worker/train/config: the JSON and YAML
// readers and JobConfigFromValue), which loom-train runs on the spec file the worker writes.
// Contract: bad text or a bad field is an InputError naming the place, never a crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "worker/train/config/job_config.h"
#include "worker/train/config/json.h"
#include "worker/train/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // Both readers on every input: ParseSpecText picks one by the first character.
  try {
    loom::train::ParseJson(text, "fuzz.json");
  } catch (const loom::train::InputError&) {
  }
  try {
    loom::train::Value spec = loom::train::ParseSpecText(text, "fuzz.yaml");
    loom::train::JobConfig config = loom::train::JobConfigFromValue(spec, "fuzz.yaml");
    (void)config;
    // A spec merged onto itself is read the same way (MergeSpecs is how flags and the file
    // combine).
    loom::train::JobConfigFromValue(loom::train::MergeSpecs(spec, spec), "fuzz.yaml");
  } catch (const loom::train::InputError&) {
  }
  return 0;
}
