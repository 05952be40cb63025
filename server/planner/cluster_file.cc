#include "server/planner/cluster_file.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::planner {
namespace {

const std::vector<std::string> kTopKeys = {
    "nodes", "gpus_per_node", "gpu", "intra_node_gb_per_s", "inter_node_gb_per_s", "efficiency"};
const std::vector<std::string> kGpuKeys = {"model", "memory_gib", "peak_tflops",
                                           "memory_bandwidth_gb_per_s"};
const std::vector<std::string> kEfficiencyKeys = {
    "gemm_small",      "gemm_medium", "gemm_large",      "allreduce_intra",
    "allreduce_inter", "p2p",         "memory_bandwidth"};

int EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<int> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int diag = row[0];
    row[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

class Reader {
 public:
  explicit Reader(absl::string_view source) : source_(source) {}

  absl::Status Error(const YAML::Mark& mark, absl::string_view key,
                     absl::string_view problem) const {
    std::string where(source_);
    if (mark.line >= 0) absl::StrAppend(&where, ":", mark.line + 1, ":", mark.column + 1);
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", key, key.empty() ? "" : ": ", problem));
  }

  // Every key of `map` must be one of `known`; the message suggests the nearest.
  absl::Status CheckKeys(const YAML::Node& map, absl::string_view prefix,
                         const std::vector<std::string>& known) const {
    for (const auto& kv : map) {
      const std::string key = kv.first.Scalar();
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      std::string hint;
      for (const std::string& k : known) {
        if (EditDistance(key, k) <= 2) hint = absl::StrCat(" (did you mean \"", k, "\"?)");
      }
      return Error(kv.first.Mark(), absl::StrCat(prefix, key),
                   absl::StrCat("unknown key", hint, "; known: ", absl::StrJoin(known, ", ")));
    }
    return absl::OkStatus();
  }

  // A positive number under `key` of `map`, or nullopt when absent.
  absl::StatusOr<std::optional<double>> Number(const YAML::Node& map, const std::string& key,
                                               absl::string_view name) const {
    const YAML::Node n = map[key];
    if (!n) return std::optional<double>();
    double v = 0;
    if (!n.IsScalar() || !absl::SimpleAtod(n.Scalar(), &v) || !(v > 0)) {
      return Error(n.Mark(), name,
                   absl::StrCat("expected a positive number, got ",
                                n.IsScalar() ? absl::StrCat("\"", n.Scalar(), "\"")
                                             : "a "
                                               "collection"));
    }
    return std::optional<double>(v);
  }

  absl::StatusOr<int> Integer(const YAML::Node& map, const std::string& key, absl::string_view name,
                              const YAML::Mark& parent) const {
    const YAML::Node n = map[key];
    if (!n) return Error(parent, name, "missing (a positive integer)");
    int v = 0;
    if (!n.IsScalar() || !absl::SimpleAtoi(n.Scalar(), &v) || v <= 0) {
      return Error(n.Mark(), name,
                   absl::StrCat("expected a positive integer, got ",
                                n.IsScalar() ? absl::StrCat("\"", n.Scalar(), "\"")
                                             : "a "
                                               "collection"));
    }
    return v;
  }

 private:
  absl::string_view source_;
};

absl::StatusOr<DeviceSpec> Build(const YAML::Node& root, const Reader& rd) {
  if (!root.IsMap()) return rd.Error(root.Mark(), "", "expected a mapping of cluster keys");
  if (absl::Status s = rd.CheckKeys(root, "", kTopKeys); !s.ok()) return s;
  absl::StatusOr<int> nodes = rd.Integer(root, "nodes", "nodes", root.Mark());
  if (!nodes.ok()) return nodes.status();
  absl::StatusOr<int> per_node = rd.Integer(root, "gpus_per_node", "gpus_per_node", root.Mark());
  if (!per_node.ok()) return per_node.status();
  if (int64_t{*nodes} * *per_node > (1 << 24)) {
    return rd.Error(root["nodes"].Mark(), "nodes", "nodes × gpus_per_node is implausibly large");
  }

  const YAML::Node gpu = root["gpu"];
  if (!gpu) return rd.Error(root.Mark(), "gpu", "missing ({model, memory_gib, peak_tflops})");
  if (!gpu.IsMap()) return rd.Error(gpu.Mark(), "gpu", "expected a mapping");
  if (absl::Status s = rd.CheckKeys(gpu, "gpu.", kGpuKeys); !s.ok()) return s;
  const YAML::Node model = gpu["model"];
  if (!model || !model.IsScalar() || model.Scalar().empty()) {
    return rd.Error(model ? model.Mark() : gpu.Mark(), "gpu.model", "missing (e.g. H100-SXM)");
  }

  absl::StatusOr<DeviceSpec> known = DefaultDevice(model.Scalar(), *nodes * *per_node, *per_node);
  DeviceSpec d;
  if (known.ok()) {
    d = *known;
  } else {
    d.model = model.Scalar();
    d.count = *nodes * *per_node;
    d.per_node = *per_node;
  }
  struct Field {
    const YAML::Node& map;
    const char* key;
    const char* name;
    double scale;
    double* out;
  };
  const Field fields[] = {
      {gpu, "memory_gib", "gpu.memory_gib", 1024.0 * 1024.0 * 1024.0, &d.memory_bytes},
      {gpu, "peak_tflops", "gpu.peak_tflops", 1e12, &d.peak_flops},
      {gpu, "memory_bandwidth_gb_per_s", "gpu.memory_bandwidth_gb_per_s", 1e9,
       &d.memory_bandwidth_bytes_per_s},
      {root, "intra_node_gb_per_s", "intra_node_gb_per_s", 1e9, &d.intra_node_bytes_per_s},
      {root, "inter_node_gb_per_s", "inter_node_gb_per_s", 1e9, &d.inter_node_bytes_per_s},
  };
  for (const Field& f : fields) {
    absl::StatusOr<std::optional<double>> v = rd.Number(f.map, f.key, f.name);
    if (!v.ok()) return v.status();
    if (v->has_value()) {
      *f.out = **v * f.scale;
    } else if (!known.ok()) {
      return rd.Error(f.map.Mark(), f.name,
                      absl::StrCat("missing; required because gpu.model \"", d.model,
                                   "\" is not one of: ", absl::StrJoin(KnownDeviceModels(), ", ")));
    }
  }

  if (const YAML::Node eff = root["efficiency"]) {
    if (!eff.IsMap()) return rd.Error(eff.Mark(), "efficiency", "expected a mapping");
    if (absl::Status s = rd.CheckKeys(eff, "efficiency.", kEfficiencyKeys); !s.ok()) return s;
    EfficiencyOverrides o;
    std::optional<double>* slots[] = {&o.gemm_small,      &o.gemm_medium,     &o.gemm_large,
                                      &o.allreduce_intra, &o.allreduce_inter, &o.p2p,
                                      &o.memory_bandwidth};
    for (size_t i = 0; i < kEfficiencyKeys.size(); ++i) {
      const std::string name = absl::StrCat("efficiency.", kEfficiencyKeys[i]);
      absl::StatusOr<std::optional<double>> v = rd.Number(eff, kEfficiencyKeys[i], name);
      if (!v.ok()) return v.status();
      if (v->has_value() && **v > 1.0) {
        return rd.Error(eff[kEfficiencyKeys[i]].Mark(), name, "a fraction must be in (0, 1]");
      }
      *slots[i] = *v;
    }
    d.efficiency = ApplyOverrides(d.efficiency, o);
  }
  return d;
}

}  // namespace

absl::StatusOr<DeviceSpec> ParseClusterYaml(absl::string_view text, absl::string_view source) {
  Reader rd(source);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
    return Build(root, rd);
  } catch (const YAML::Exception& e) {
    // yaml-cpp throws for malformed YAML (ParserException) and on odd node access; both carry
    // the position.
    return rd.Error(e.mark, "", e.msg);
  }
}

absl::StatusOr<DeviceSpec> LoadClusterFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read cluster file ", path));
  std::stringstream buf;
  buf << in.rdbuf();
  return ParseClusterYaml(buf.str(), path);
}

}  // namespace loom::planner
