#include "common/yaml_json.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace loom {
namespace {

bool AllOf(absl::string_view s, bool (*pred)(unsigned char)) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!pred(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool IsDigit(unsigned char c) { return c >= '0' && c <= '9'; }
bool IsHexDigit(unsigned char c) { return absl::ascii_isxdigit(c); }
bool IsOctDigit(unsigned char c) { return c >= '0' && c <= '7'; }

// [-+]? ( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?  (YAML 1.2 core float)
bool IsCoreFloat(absl::string_view s) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  size_t int_digits = 0;
  while (i < s.size() && IsDigit(s[i])) ++i, ++int_digits;
  size_t frac_digits = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && IsDigit(s[i])) ++i, ++frac_digits;
  }
  if (int_digits == 0 && frac_digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    if (!(i < s.size() && IsDigit(s[i]))) return false;
    while (i < s.size() && IsDigit(s[i])) ++i;
  }
  return i == s.size();
}

std::optional<nlohmann::json> ParseInteger(absl::string_view s) {
  bool negative = false;
  absl::string_view body = s;
  if (!body.empty() && (body[0] == '-' || body[0] == '+')) {
    negative = body[0] == '-';
    body.remove_prefix(1);
  }
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'o')) {
    // Hex and octal have no sign in the core schema.
    base = s[1] == 'x' ? 16 : 8;
    body = s.substr(2);
    negative = false;
    if (!AllOf(body, base == 16 ? IsHexDigit : IsOctDigit)) return std::nullopt;
  } else if (!AllOf(body, IsDigit)) {
    return std::nullopt;
  }
  uint64_t magnitude = 0;
  auto [ptr, ec] = std::from_chars(body.data(), body.data() + body.size(), magnitude, base);
  if (ec != std::errc() || ptr != body.data() + body.size()) return std::nullopt;  // overflow
  if (negative) {
    if (magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1) {
      return std::nullopt;
    }
    return nlohmann::json(static_cast<int64_t>(0 - magnitude));
  }
  if (magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return nlohmann::json(magnitude);
  }
  return nlohmann::json(static_cast<int64_t>(magnitude));
}

// Shortest text that reads back as the same double, always recognisable as a float.
std::string FormatDouble(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  std::string out(buf, ec == std::errc() ? ptr : buf);
  // YAML 1.1 readers (PyYAML) need a '.' to see a float: "6e-04" -> "6.0e-04", "3" -> "3.0".
  const size_t exponent = out.find_first_of("eE");
  if (out.find('.') == std::string::npos) {
    out.insert(exponent == std::string::npos ? out.size() : exponent, ".0");
  }
  return out;
}

// Whether `s` must be written double-quoted to read back as the same string: text YAML would
// type (12, true, ""), and text yaml-cpp's emitter would write plain but a reader changes:
// control characters (a trailing '\r' is dropped, found by tests/fuzz/spec_yaml_fuzz) and
// leading or trailing blanks.
bool NeedsQuotes(const std::string& s) {
  if (TypedPlainScalar(s).has_value()) return true;
  if (s.front() == ' ' || s.back() == ' ') return true;
  return std::any_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7F;
  });
}

void Emit(const nlohmann::ordered_json& v, YAML::Emitter& out) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::object:
      out << YAML::BeginMap;
      for (const auto& [key, child] : v.items()) {
        // A reader takes an implicit key of at most 1024 characters, and escaping writes a byte
        // as up to four ("\x1b"): keys over 100 bytes are written explicit ("? key").
        if (key.size() > 100) out << YAML::LongKey;
        out << YAML::Key;
        if (NeedsQuotes(key)) {
          out << YAML::DoubleQuoted << key;
        } else {
          out << key;
        }
        out << YAML::Value;
        Emit(child, out);
      }
      out << YAML::EndMap;
      return;
    case nlohmann::ordered_json::value_t::array:
      out << YAML::BeginSeq;
      for (const auto& child : v) Emit(child, out);
      out << YAML::EndSeq;
      return;
    case nlohmann::ordered_json::value_t::string: {
      const std::string& s = v.get_ref<const std::string&>();
      if (NeedsQuotes(s)) {
        out << YAML::DoubleQuoted << s;
      } else {
        out << s;
      }
      return;
    }
    case nlohmann::ordered_json::value_t::boolean:
      out << (v.get<bool>() ? "true" : "false");
      return;
    case nlohmann::ordered_json::value_t::number_integer:
      out << std::to_string(v.get<int64_t>());
      return;
    case nlohmann::ordered_json::value_t::number_unsigned:
      out << std::to_string(v.get<uint64_t>());
      return;
    case nlohmann::ordered_json::value_t::number_float:
      out << FormatDouble(v.get<double>());
      return;
    default:
      out << YAML::Null;
      return;
  }
}

// Counts the documents of a YAML stream from the parser's events, without building them.
class DocumentCounter final : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (count_ > 0 && mark.pos == last_start_.pos) stalled_ = true;
    last_start_ = mark;
    ++count_;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  int count() const { return count_; }
  // Whether a document started where the previous one did: the parser made no progress (as
  // yaml-cpp 0.7 does forever on a ',' outside [ ] or { }, which LoadAll turns into an endless
  // list of empty documents).
  bool stalled() const { return stalled_; }
  // The start of the latest document.
  const YAML::Mark& last_start() const { return last_start_; }

 private:
  int count_ = 0;
  bool stalled_ = false;
  YAML::Mark last_start_;
};

}  // namespace

absl::StatusOr<YAML::Node> ParseYamlDocument(absl::string_view text,
                                             absl::string_view source_name) {
  // The client's one boundary with yaml-cpp's exceptions.
  try {
    // Count the documents first: YAML::LoadAll never returns on some inputs (a stray ',').
    std::istringstream stream{std::string(text)};
    YAML::Parser parser(stream);
    DocumentCounter counter;
    YAML::Mark second;
    while (parser.HandleNextDocument(counter)) {
      if (counter.stalled()) {
        const YAML::Mark& m = counter.last_start();
        return absl::InvalidArgumentError(
            absl::StrCat(source_name, ":", m.line + 1, ":", m.column + 1,
                         ": YAML syntax error: unexpected character (a ',' outside [ ] or { }?)"));
      }
      if (counter.count() == 2) second = counter.last_start();
    }
    if (counter.count() == 0) return YAML::Node(YAML::NodeType::Null);
    if (counter.count() > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_name, ":", second.line + 1, ":", second.column + 1,
                       ": expected one YAML document, found ", counter.count(),
                       "; remove the extra '---' documents"));
    }
    return YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        source_name, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML syntax error: ", e.msg));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ": cannot read YAML: ", e.what()));
  }
}

std::optional<nlohmann::json> TypedPlainScalar(absl::string_view s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") {
    return nlohmann::json(nullptr);
  }
  if (s == "true" || s == "True" || s == "TRUE") return nlohmann::json(true);
  if (s == "false" || s == "False" || s == "FALSE") return nlohmann::json(false);
  if (auto i = ParseInteger(s)) return i;
  absl::string_view unsigned_part = s;
  bool negative = false;
  if (!unsigned_part.empty() && (unsigned_part[0] == '-' || unsigned_part[0] == '+')) {
    negative = unsigned_part[0] == '-';
    unsigned_part.remove_prefix(1);
  }
  if (unsigned_part == ".inf" || unsigned_part == ".Inf" || unsigned_part == ".INF") {
    return nlohmann::json(negative ? -std::numeric_limits<double>::infinity()
                                   : std::numeric_limits<double>::infinity());
  }
  if (s == ".nan" || s == ".NaN" || s == ".NAN") {
    return nlohmann::json(std::numeric_limits<double>::quiet_NaN());
  }
  if (IsCoreFloat(s)) {
    // strtod is locale-dependent only for the decimal point; the C locale is in effect.
    return nlohmann::json(std::strtod(std::string(s).c_str(), nullptr));
  }
  return std::nullopt;
}

bool IsPlainScalar(const YAML::Node& node) {
  // yaml-cpp tags plain scalars "?" (non-specific) and quoted ones "!".
  return node.IsScalar() && node.Tag() != "!";
}

nlohmann::json YamlToJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json obj = nlohmann::json::object();
      for (auto it = node.begin(); it != node.end(); ++it) {
        const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
        obj[key] = YamlToJson(it->second);
      }
      return obj;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json arr = nlohmann::json::array();
      for (const auto& child : node) arr.push_back(YamlToJson(child));
      return arr;
    }
    case YAML::NodeType::Scalar: {
      if (IsPlainScalar(node)) {
        if (auto typed = TypedPlainScalar(node.Scalar())) return *typed;
      }
      return nlohmann::json(node.Scalar());
    }
    default:
      return nlohmann::json(nullptr);
  }
}

std::string JsonToYaml(const nlohmann::ordered_json& value) {
  YAML::Emitter out;
  Emit(value, out);
  std::string text = out.c_str();
  if (!text.empty() && text.back() != '\n') text += '\n';
  return text;
}

}  // namespace loom
