#include "common/spec_yaml.h"

#include <google/protobuf/descriptor.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/echo.h"
#include "common/json_message.h"
#include "common/status_macros.h"
#include "common/yaml_json.h"

namespace loom {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using nlohmann::json;

// A spec travels as text in a CreateJob request (job.proto JobSpecYaml), which loomd takes up to
// 4 MiB; a real spec is a few KiB, so 1 MiB leaves room for comments and is far from that.
constexpr size_t kMaxSpecBytes = 1 << 20;

// Reads at most kMaxSpecBytes + 1 bytes of `in`, so that /dev/zero or a huge file is refused
// after a megabyte instead of being read whole. In 16 KiB steps: sizing the buffer for the limit
// up front would clear a megabyte for every few-KiB spec (a quarter of a submit's instructions).
void ReadBounded(std::istream& in, std::string* text) {
  constexpr size_t kStep = 16 << 10;
  text->clear();
  while (in && text->size() <= kMaxSpecBytes) {
    const size_t old_size = text->size();
    text->resize(old_size + kStep);
    in.read(text->data() + old_size, static_cast<std::streamsize>(kStep));
    text->resize(old_size + static_cast<size_t>(in.gcount()));
  }
}

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      const bool same = absl::ascii_tolower(a[i - 1]) == absl::ascii_tolower(b[j - 1]);
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (same ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string Join(absl::string_view path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

// A key the user wrote, as an error's key path shows it: as written when it is short printable
// text without quotes, else quoted and cut by Echo. Errors go back to the client from loomd
// (CreateJobRequest.spec_yaml), so they never repeat a long or binary key or value.
std::string ShownKey(absl::string_view key) {
  const bool plain = !key.empty() && key.size() <= kMaxEchoBytes &&
                     std::all_of(key.begin(), key.end(), [](char c) {
                       return c > 0x20 && c < 0x7f && c != '"' && c != '\'';
                     });
  return plain ? std::string(key) : Echo(key);
}

std::string KindOf(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return Echo(node.Scalar());
    default:
      return "nothing";
  }
}

bool IsWellKnownType(const Descriptor* d) { return d->file()->package() == "google.protobuf"; }

// Walks a YAML tree alongside a message descriptor and produces checked JSON (json_message.h:
// every key a field, every value of its field's type and range), or the first error with its
// position.
class Converter {
 public:
  explicit Converter(absl::string_view source) : source_(source) {}

  absl::StatusOr<json> Message(const YAML::Node& node, const Descriptor* d, const std::string& path,
                               const YAML::Mark& where) {
    if (node.IsNull()) return json::object();
    if (!node.IsMap()) {
      if (path.empty()) {
        return Error(where, "",
                     absl::StrCat("a job spec must be a YAML mapping of keys such as 'name:', "
                                  "'model:' and 'resources:', got ",
                                  KindOf(node)));
      }
      return Error(where, path,
                   absl::StrCat("expected a mapping of ", d->name(), " fields (e.g. '",
                                path.substr(path.rfind('.') + 1), ": {", d->field(0)->json_name(),
                                ": ...}'), got ", KindOf(node)));
    }
    json out = json::object();
    std::map<int, int> seen_line_by_field;  // field number -> 1-based line of its first key
    for (auto it = node.begin(); it != node.end(); ++it) {
      // Copies (cheap handles), not references: `it->` returns a temporary proxy, so a
      // reference to its first or second dangles at the end of the statement (found by
      // tests/fuzz/spec_yaml_fuzz under ASan: stack-use-after-scope on the first key).
      const YAML::Node key_node = it->first;
      const YAML::Node value = it->second;
      const YAML::Mark key_mark = key_node.Mark();
      if (!key_node.IsScalar()) {
        return Error(key_mark, path,
                     "a key must be a plain word such as 'name', not a list or map");
      }
      const std::string key = key_node.Scalar();
      const std::string key_path = Join(path, key);
      const FieldDescriptor* field = FieldByEitherName(d, key);
      if (field == nullptr) return UnknownKey(key_mark, d, path, key);
      auto [prev, inserted] = seen_line_by_field.emplace(field->number(), key_mark.line + 1);
      if (!inserted) {
        return Error(key_mark, key_path,
                     absl::StrCat("given twice (first at line ", prev->second, "); keep only one"));
      }
      const YAML::Mark value_mark = value.IsNull() ? key_mark : value.Mark();
      ASSIGN_OR_RETURN(std::optional<json> converted, Field(value, field, key_path, value_mark));
      if (converted.has_value()) out[field->json_name()] = *std::move(converted);
    }
    return out;
  }

 private:
  absl::Status Error(const YAML::Mark& m, absl::string_view path, absl::string_view problem) {
    return absl::InvalidArgumentError(absl::StrCat(source_, ":", m.line + 1, ":", m.column + 1,
                                                   ": ", path, path.empty() ? "" : ": ", problem));
  }

  absl::Status UnknownKey(const YAML::Mark& m, const Descriptor* d, const std::string& path,
                          const std::string& key) {
    std::vector<std::string> names;
    std::string best;
    size_t best_distance = std::numeric_limits<size_t>::max();
    // No suggestion for a key longer than any field name could be close to: the edit distance
    // costs its length times each name's, and the key comes from a client (spec_yaml).
    const bool suggest = key.size() <= kMaxEchoBytes;
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      names.push_back(f->name());
      if (!suggest) continue;
      for (const std::string& candidate : {f->name(), f->json_name()}) {
        const size_t dist = EditDistance(key, candidate);
        if (dist < best_distance) best_distance = dist, best = candidate;
      }
    }
    std::string hint;
    if (best_distance <= std::max<size_t>(2, key.size() / 3)) {
      hint = absl::StrCat("did you mean '", best, "'? ");
    }
    return Error(m, Join(path, ShownKey(key)),
                 absl::StrCat("unknown key; ", hint, "valid keys",
                              path.empty() ? "" : absl::StrCat(" of '", path, "'"), ": ",
                              absl::StrJoin(names, ", ")));
  }

  // nullopt: leave the field unset (an empty value of a scalar, list or map field).
  absl::StatusOr<std::optional<json>> Field(const YAML::Node& node, const FieldDescriptor* f,
                                            const std::string& path, const YAML::Mark& where) {
    if (f->is_map()) {
      if (node.IsNull()) return std::optional<json>();
      if (!node.IsMap()) {
        return Error(where, path,
                     absl::StrCat("expected a mapping (e.g. '", f->name(), ": {KEY: value}'), got ",
                                  KindOf(node)));
      }
      const FieldDescriptor* value_field = f->message_type()->map_value();
      json out = json::object();
      for (auto it = node.begin(); it != node.end(); ++it) {
        if (!it->first.IsScalar()) {
          return Error(it->first.Mark(), path, "a map key must be a scalar");
        }
        const std::string key = it->first.Scalar();
        const YAML::Mark value_mark = it->second.IsNull() ? it->first.Mark() : it->second.Mark();
        ASSIGN_OR_RETURN(json v,
                         Singular(it->second, value_field, Join(path, ShownKey(key)), value_mark));
        out[key] = std::move(v);
      }
      return std::optional<json>(std::move(out));
    }
    if (f->is_repeated()) {
      if (node.IsNull()) return std::optional<json>();
      if (!node.IsSequence()) {
        return Error(where, path,
                     absl::StrCat("expected a list ([a, b] or '- a' lines), got ", KindOf(node)));
      }
      json out = json::array();
      for (size_t i = 0; i < node.size(); ++i) {
        const YAML::Node item = node[i];
        ASSIGN_OR_RETURN(json v, Singular(item, f, absl::StrCat(path, "[", i, "]"),
                                          item.IsNull() ? where : item.Mark()));
        out.push_back(std::move(v));
      }
      return std::optional<json>(std::move(out));
    }
    if (node.IsNull() && f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) {
      return std::optional<json>();
    }
    ASSIGN_OR_RETURN(json v, Singular(node, f, path, where));
    return std::optional<json>(std::move(v));
  }

  absl::StatusOr<json> Singular(const YAML::Node& node, const FieldDescriptor* f,
                                const std::string& path, const YAML::Mark& where) {
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (IsWellKnownType(f->message_type())) return YamlToJson(node);
      return Message(node, f->message_type(), path, where);
    }
    if (!node.IsScalar() && !node.IsNull()) {
      return Error(where, path, absl::StrCat("expected ", Expected(f), ", got ", KindOf(node)));
    }
    const std::string text = node.IsNull() ? "" : node.Scalar();
    const std::optional<json> typed = TypedPlainScalar(text);
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        return json(text);
      case FieldDescriptor::CPPTYPE_BOOL:
        if (IsPlainScalar(node) && typed.has_value() && typed->is_boolean()) return *typed;
        return Error(where, path, absl::StrCat("expected true or false, got ", Echo(text)));
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64:
      case FieldDescriptor::CPPTYPE_UINT32:
      case FieldDescriptor::CPPTYPE_UINT64:
        return Integer(typed, text, f, path, where);
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT:
        if (typed.has_value() && typed->is_number()) {
          const double v = typed->get<double>();
          if (std::isnan(v)) return json("NaN");
          if (std::isinf(v)) return json(v > 0 ? "Infinity" : "-Infinity");
          return json(v);
        }
        return Error(where, path, absl::StrCat("expected a number, got ", Echo(text)));
      case FieldDescriptor::CPPTYPE_ENUM:
        return Enum(typed, text, f->enum_type(), path, where);
      default:
        return Error(where, path, "this field cannot be set from YAML");
    }
  }

  absl::StatusOr<json> Integer(const std::optional<json>& typed, const std::string& text,
                               const FieldDescriptor* f, const std::string& path,
                               const YAML::Mark& where) {
    const bool is_unsigned = f->cpp_type() == FieldDescriptor::CPPTYPE_UINT32 ||
                             f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64;
    const bool is_32 = f->cpp_type() == FieldDescriptor::CPPTYPE_INT32 ||
                       f->cpp_type() == FieldDescriptor::CPPTYPE_UINT32;
    const double lo = is_unsigned ? 0.0
                      : is_32     ? static_cast<double>(std::numeric_limits<int32_t>::min())
                                  : static_cast<double>(std::numeric_limits<int64_t>::min());
    const double hi = is_unsigned
                          ? (is_32 ? static_cast<double>(std::numeric_limits<uint32_t>::max())
                                   : static_cast<double>(std::numeric_limits<uint64_t>::max()))
                      : is_32 ? static_cast<double>(std::numeric_limits<int32_t>::max())
                              : static_cast<double>(std::numeric_limits<int64_t>::max());
    if (typed.has_value() && typed->is_number_integer()) {
      const double v = typed->is_number_unsigned() ? static_cast<double>(typed->get<uint64_t>())
                                                   : static_cast<double>(typed->get<int64_t>());
      if (v < lo || v > hi) {
        return Error(
            where, path,
            absl::StrCat(text, " is out of range; expected an integer from ",
                         absl::StrFormat("%.0f", lo), " to ", absl::StrFormat("%.0f", hi)));
      }
      return *typed;
    }
    if (typed.has_value() && typed->is_number_float()) {
      const double v = typed->get<double>();
      // 5e5 is a fine way to write an integer; 0.5 is not.
      if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) <= 9007199254740992.0 && v >= lo &&
          v <= hi) {
        return json(static_cast<int64_t>(v));
      }
    }
    return Error(where, path, absl::StrCat("expected an integer, got ", Echo(text)));
  }

  absl::StatusOr<json> Enum(const std::optional<json>& typed, const std::string& text,
                            const EnumDescriptor* e, const std::string& path,
                            const YAML::Mark& where) {
    const EnumValueDescriptor* v = e->FindValueByName(text);
    if (v == nullptr) v = e->FindValueByName(absl::AsciiStrToUpper(text));
    if (v == nullptr && typed.has_value() && typed->is_number_integer()) {
      v = e->FindValueByNumber(typed->get<int>());
    }
    if (v != nullptr) return json(v->name());
    std::vector<std::string> names;
    for (int i = 0; i < e->value_count(); ++i) names.push_back(e->value(i)->name());
    return Error(
        where, path,
        absl::StrCat("unknown value '", text, "'; expected one of ", absl::StrJoin(names, ", ")));
  }

  static std::string Expected(const FieldDescriptor* f) {
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        return "a string";
      case FieldDescriptor::CPPTYPE_BOOL:
        return "true or false";
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT:
        return "a number";
      case FieldDescriptor::CPPTYPE_ENUM:
        return "an enum name";
      default:
        return "an integer";
    }
  }

  std::string source_;
};

// The offset of the first byte of `s` that is not part of well-formed UTF-8 (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF), or npos. YAML text may carry any
// bytes in a scalar, but JSON (and the proto's string fields) must be UTF-8.
size_t InvalidUtf8At(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + n >= s.size()) return i;  // cut short
    for (size_t k = 1; k <= n; ++k) {
      const unsigned char b = static_cast<unsigned char>(s[i + k]);
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return i;
    }
    i += n + 1;
  }
  return std::string::npos;
}

// The first string or key of `tree` that is not UTF-8, as an error naming its path.
absl::Status CheckUtf8(const json& tree, const std::string& path, absl::string_view source) {
  auto bad = [&](const std::string& where, const std::string& text, size_t at) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %s: not UTF-8 text (byte 0x%02X at offset %d); write the spec as UTF-8",
        std::string(source), where.empty() ? "(top level)" : where,
        static_cast<unsigned char>(text[at]), at));
  };
  if (tree.is_string()) {
    const std::string& text = tree.get_ref<const std::string&>();
    const size_t at = InvalidUtf8At(text);
    return at == std::string::npos ? absl::OkStatus() : bad(path, text, at);
  }
  if (tree.is_object()) {
    for (const auto& [key, value] : tree.items()) {
      const std::string key_path = Join(path, ShownKey(key));
      const size_t at = InvalidUtf8At(key);
      if (at != std::string::npos) return bad(Join(path, "(a key)"), key, at);
      RETURN_IF_ERROR(CheckUtf8(value, key_path, source));
    }
  } else if (tree.is_array()) {
    for (size_t i = 0; i < tree.size(); ++i) {
      RETURN_IF_ERROR(CheckUtf8(tree[i], absl::StrCat(path, "[", i, "]"), source));
    }
  }
  return absl::OkStatus();
}

// Resolves a relative path against `base_dir`; leaves empty and absolute paths alone.
void Resolve(std::string* path, const std::filesystem::path& base_dir) {
  if (path->empty() || base_dir.empty()) return;
  const std::filesystem::path p(*path);
  if (p.is_absolute()) return;
  *path = (base_dir / p).lexically_normal().string();
}

}  // namespace

namespace internal {

absl::StatusOr<nlohmann::json> JobSpecJson(absl::string_view yaml, absl::string_view source_name) {
  ASSIGN_OR_RETURN(YAML::Node root, ParseYamlDocument(yaml, source_name));
  if (root.IsNull()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name,
                     ": the job spec is empty; write at least 'resources:', "
                     "'model:' and 'train:' (see the example in the user guide)"));
  }
  Converter converter(source_name);
  ASSIGN_OR_RETURN(json tree,
                   converter.Message(root, loom::v1::JobSpec::descriptor(), "", root.Mark()));
  // Strings and keys that are not UTF-8 are found here, with their path: neither JSON nor the
  // proto's string fields may hold them.
  RETURN_IF_ERROR(CheckUtf8(tree, "", source_name));
  return tree;
}

}  // namespace internal

absl::StatusOr<loom::v1::JobSpec> JobSpecFromYaml(absl::string_view yaml,
                                                  absl::string_view source_name,
                                                  const std::filesystem::path& base_dir) {
  ASSIGN_OR_RETURN(json tree, internal::JobSpecJson(yaml, source_name));
  loom::v1::JobSpec spec;
  if (absl::Status s = SetMessageFromCheckedJson(tree, &spec); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": invalid job spec: ", s.message()));
  }
  // Only messages the YAML has: an empty `checkpoint {}` made here would make the spec differ
  // from the same spec sent as a message (and a retry by request_id would be refused).
  if (spec.has_data()) {
    Resolve(spec.mutable_data()->mutable_path(), base_dir);
    Resolve(spec.mutable_data()->mutable_val_path(), base_dir);
  }
  if (spec.has_checkpoint()) Resolve(spec.mutable_checkpoint()->mutable_dir(), base_dir);
  return spec;
}

absl::StatusOr<loom::v1::JobSpecYaml> ReadJobSpecFile(const std::string& path) {
  loom::v1::JobSpecYaml yaml;
  std::string* text = yaml.mutable_text();
  std::error_code ec;
  if (path == "-") {
    yaml.set_source("<stdin>");
    ReadBounded(std::cin, text);
    yaml.set_base_dir(std::filesystem::current_path(ec).string());
  } else {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::NotFoundError(absl::StrCat("cannot read job spec '", path,
                                              "': ", std::strerror(errno),
                                              "; pass an existing YAML file with -f"));
    }
    ReadBounded(in, text);
    yaml.set_source(path);
    yaml.set_base_dir(std::filesystem::absolute(path, ec).parent_path().string());
  }
  if (text->size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat(yaml.source(), ": the job spec is over ",
                                                   kMaxSpecBytes,
                                                   " bytes; a spec is a few KiB, pass the "
                                                   "right file"));
  }
  return yaml;
}

absl::StatusOr<loom::v1::JobSpec> JobSpecFromYamlMessage(const loom::v1::JobSpecYaml& yaml) {
  if (yaml.text().size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat("spec_yaml.text: the job spec is ",
                                                   yaml.text().size(), " bytes; the limit is ",
                                                   kMaxSpecBytes));
  }
  // The source is echoed into every error message: short, and nothing a terminal interprets.
  constexpr size_t kMaxSourceBytes = 512;
  const std::string& source = yaml.source();
  if (source.size() > kMaxSourceBytes || std::any_of(source.begin(), source.end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
      })) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec_yaml.source: at most ", kMaxSourceBytes,
                     " bytes without control characters; send the spec file's name (or nothing)"));
  }
  std::filesystem::path base_dir;
  if (!yaml.base_dir().empty()) {
    // The resolved paths are then confined by the spec validator like any other paths.
    constexpr size_t kMaxBaseDirBytes = 4096;
    base_dir = yaml.base_dir();
    if (yaml.base_dir().size() > kMaxBaseDirBytes || !base_dir.is_absolute() ||
        yaml.base_dir().find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec_yaml.base_dir: must be an absolute directory (at most ", kMaxBaseDirBytes,
          " bytes, no NUL); send the spec file's directory, or nothing to leave relative paths "
          "as written"));
    }
  }
  return JobSpecFromYaml(yaml.text(), source.empty() ? "spec_yaml" : source, base_dir);
}

absl::StatusOr<loom::v1::JobSpec> LoadJobSpecFile(const std::string& path) {
  ASSIGN_OR_RETURN(loom::v1::JobSpecYaml yaml, ReadJobSpecFile(path));
  return JobSpecFromYamlMessage(yaml);
}

}  // namespace loom
