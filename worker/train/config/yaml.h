// A reader for the subset of YAML that job specs use (DESIGN.md, "The API"):
//   - block mappings by indentation (spaces only), `key: value` and `key:` + nested block;
//   - flow mappings `{a: 1, b: {}}` and flow sequences `[1, 2]`, which may span lines;
//   - plain, 'single-quoted' and "double-quoted" scalars; `#` comments; a leading `---`.
// Not supported (a clear error instead): block sequences (`- item`), anchors, aliases, tags,
// multi-line plain scalars and block scalars (`|`, `>`).
//
// The result uses the JSON document model: plain scalars are typed as null (``, `~`, `null`),
// boolean (`true`, `false`), number (when the whole scalar reads as one) or string; quoted
// scalars are always strings.
#ifndef LOOM_WORKER_TRAIN_CONFIG_YAML_H_
#define LOOM_WORKER_TRAIN_CONFIG_YAML_H_

#include <string>
#include <string_view>

#include "worker/train/config/json.h"

namespace loom::train {

// Parses a YAML document whose top level is a mapping (an empty document is an empty mapping).
// `source` names the document in errors. Throws InputError "source:line:col: what".
Value ParseYaml(std::string_view text, const std::string& source);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CONFIG_YAML_H_
