#include "worker/train/config/yaml.h"

#include <cstdlib>

#include "worker/train/error.h"

namespace loom::train {
namespace {

constexpr int kMaxDepth = 64;

class YamlParser {
 public:
  YamlParser(std::string_view text, const std::string& source) : text_(text), source_(source) {}

  Value ParseDocument() {
    SkipBlankLines();
    if (!AtEnd() && text_.substr(pos_, 3) == "---" && LineRestIsEmpty(pos_ + 3)) {
      pos_ += 3;
      SkipBlankLines();
    }
    Value doc;
    doc.kind = Value::Kind::kObject;
    doc.line = 1;
    if (AtEnd()) return doc;
    if (Peek() == '{') {  // a whole document in flow style, e.g. JSON
      doc = ParseFlow(0);
      ExpectLineEnd();
      SkipBlankLines();
    } else {
      doc = ParseBlockMapping(Column(), 0);
    }
    if (!AtEnd()) Fail("unexpected content (check the indentation)");
    return doc;
  }

 private:
  [[noreturn]] void Fail(const std::string& what) const {
    auto [line, col] = Position(pos_);
    throw InputError(source_ + ":" + std::to_string(line) + ":" + std::to_string(col) + ": " +
                     what);
  }

  std::pair<int, int> Position(size_t at) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return {line, col};
  }

  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }

  // 0-based column of pos_ within its line.
  int Column() const {
    size_t start = pos_;
    while (start > 0 && text_[start - 1] != '\n') --start;
    return static_cast<int>(pos_ - start);
  }

  void SkipSpaces() {
    while (!AtEnd() && Peek() == ' ') ++pos_;
    if (!AtEnd() && Peek() == '\t') Fail("tab characters are not allowed in YAML indentation");
  }

  // True when only spaces and an optional comment remain on the line starting at `at`.
  bool LineRestIsEmpty(size_t at) const {
    while (at < text_.size() && (text_[at] == ' ' || text_[at] == '\r')) ++at;
    return at >= text_.size() || text_[at] == '\n' || text_[at] == '#';
  }

  void SkipToLineEnd() {
    while (!AtEnd() && Peek() != '\n') ++pos_;
  }

  // Moves pos_ to the first non-space character of the next line that has content (not blank,
  // not only a comment), or to the end.
  void SkipBlankLines() {
    while (!AtEnd()) {
      while (!AtEnd() && Peek() == ' ') ++pos_;
      if (!AtEnd() && Peek() == '\t') Fail("tab characters are not allowed in YAML indentation");
      if (AtEnd()) return;
      char c = Peek();
      if (c == '#' || c == '\n' || c == '\r') {
        SkipToLineEnd();
        if (!AtEnd()) ++pos_;
        continue;
      }
      return;
    }
  }

  // Skips spaces, newlines and comments inside a flow collection.
  void SkipFlowSpace() {
    while (!AtEnd()) {
      char c = Peek();
      if (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        SkipToLineEnd();
      } else {
        return;
      }
    }
  }

  // After a value: only spaces and an optional comment may remain on the line.
  void ExpectLineEnd() {
    while (!AtEnd() && (Peek() == ' ' || Peek() == '\r')) ++pos_;
    if (AtEnd()) return;
    if (Peek() == '#') SkipToLineEnd();
    if (AtEnd()) return;
    if (Peek() != '\n') Fail(std::string("unexpected '") + Peek() + "' after a value");
    ++pos_;
  }

  Value ParseBlockMapping(int indent, int depth) {
    if (depth > kMaxDepth) Fail("nesting deeper than 64 levels");
    Value map;
    map.kind = Value::Kind::kObject;
    map.line = Position(pos_).first;
    while (true) {
      SkipBlankLines();
      if (AtEnd()) break;
      int col = Column();
      if (col < indent) break;
      if (col > indent) Fail("unexpected indentation");
      if (Peek() == '-' &&
          (pos_ + 1 >= text_.size() || text_[pos_ + 1] == ' ' || text_[pos_ + 1] == '\n')) {
        Fail("block sequences ('- item') are not supported; use a flow sequence [a, b]");
      }
      size_t key_pos = pos_;
      std::string key = ParseKey();
      if (map.Find(key) != nullptr) {
        pos_ = key_pos;
        Fail("duplicate key \"" + key + "\"");
      }
      if (Peek() != ':') Fail("expected ':' after the key \"" + key + "\"");
      ++pos_;
      SkipSpaces();
      Value value;
      if (AtEnd() || Peek() == '#' || Peek() == '\n' || Peek() == '\r') {
        // `key:` alone: a nested block mapping on the following, deeper lines, or null.
        value.line = Position(pos_).first;
        ExpectLineEnd();
        SkipBlankLines();
        if (!AtEnd() && Column() > indent) value = ParseBlockMapping(Column(), depth + 1);
      } else {
        value = ParseInlineValue(depth + 1);
        ExpectLineEnd();
      }
      map.members.emplace_back(std::move(key), std::move(value));
    }
    return map;
  }

  // A mapping key: quoted, or plain up to the ':' that ends it.
  std::string ParseKey() {
    if (Peek() == '"' || Peek() == '\'') return ParseQuoted();
    size_t start = pos_;
    while (!AtEnd() && Peek() != '\n' && Peek() != '#') {
      if (Peek() == ':' &&
          (pos_ + 1 >= text_.size() || text_[pos_ + 1] == ' ' || text_[pos_ + 1] == '\n' ||
           text_[pos_ + 1] == '\r' || text_[pos_ + 1] == ',' || text_[pos_ + 1] == '}')) {
        break;
      }
      if (Peek() == '{' || Peek() == '[' || Peek() == '}' || Peek() == ']' || Peek() == ',') {
        Fail(std::string("unexpected '") + Peek() + "' in a key");
      }
      ++pos_;
    }
    std::string key(Trim(text_.substr(start, pos_ - start)));
    if (key.empty()) Fail("empty key");
    if (key[0] == '&' || key[0] == '*' || key[0] == '!' || key[0] == '?') {
      Fail("anchors, aliases, tags and complex keys are not supported");
    }
    return key;
  }

  static std::string_view Trim(std::string_view s) {
    while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.remove_suffix(1);
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    return s;
  }

  Value ParseInlineValue(int depth) {
    char c = Peek();
    if (c == '{' || c == '[') return ParseFlow(depth);
    Value v;
    v.line = Position(pos_).first;
    if (c == '"' || c == '\'') {
      v.kind = Value::Kind::kString;
      v.text = ParseQuoted();
      return v;
    }
    if (c == '|' || c == '>') Fail("block scalars ('|', '>') are not supported");
    if (c == '&' || c == '*' || c == '!') Fail("anchors, aliases and tags are not supported");
    size_t start = pos_;
    while (!AtEnd() && Peek() != '\n' && !(Peek() == '#' && text_[pos_ - 1] == ' ')) ++pos_;
    return TypePlain(Trim(text_.substr(start, pos_ - start)), v.line);
  }

  Value ParseFlow(int depth) {
    if (depth > kMaxDepth) Fail("nesting deeper than 64 levels");
    Value v;
    v.line = Position(pos_).first;
    char open = Peek();
    char close = open == '{' ? '}' : ']';
    v.kind = open == '{' ? Value::Kind::kObject : Value::Kind::kArray;
    ++pos_;
    SkipFlowSpace();
    if (Peek() == close) {
      ++pos_;
      return v;
    }
    while (true) {
      SkipFlowSpace();
      if (AtEnd()) Fail(std::string("unterminated flow collection, expected '") + close + "'");
      if (open == '{') {
        size_t key_pos = pos_;
        std::string key = ParseKey();
        if (v.Find(key) != nullptr) {
          pos_ = key_pos;
          Fail("duplicate key \"" + key + "\"");
        }
        SkipFlowSpace();
        if (Peek() != ':') Fail("expected ':' after the key \"" + key + "\"");
        ++pos_;
        SkipFlowSpace();
        Value member;
        if (Peek() == ',' || Peek() == '}') {
          member.line = Position(pos_).first;  // `{a: }` is a null value
        } else {
          member = ParseFlowItem(depth + 1);
        }
        v.members.emplace_back(std::move(key), std::move(member));
      } else {
        v.items.push_back(ParseFlowItem(depth + 1));
      }
      SkipFlowSpace();
      if (Peek() == ',') {
        ++pos_;
        SkipFlowSpace();
        if (Peek() == close) {  // a trailing comma is allowed in YAML flow collections
          ++pos_;
          return v;
        }
        continue;
      }
      if (Peek() == close) {
        ++pos_;
        return v;
      }
      if (AtEnd()) Fail(std::string("unterminated flow collection, expected '") + close + "'");
      Fail(std::string("expected ',' or '") + close + "'");
    }
  }

  Value ParseFlowItem(int depth) {
    char c = Peek();
    if (c == '{' || c == '[') return ParseFlow(depth);
    Value v;
    v.line = Position(pos_).first;
    if (c == '"' || c == '\'') {
      v.kind = Value::Kind::kString;
      v.text = ParseQuoted();
      return v;
    }
    size_t start = pos_;
    while (!AtEnd() && Peek() != ',' && Peek() != '}' && Peek() != ']' && Peek() != '\n' &&
           !(Peek() == '#' && text_[pos_ - 1] == ' ')) {
      ++pos_;
    }
    return TypePlain(Trim(text_.substr(start, pos_ - start)), v.line);
  }

  std::string ParseQuoted() {
    char quote = Peek();
    ++pos_;
    std::string out;
    while (true) {
      if (AtEnd() || Peek() == '\n') Fail("unterminated quoted string");
      char c = text_[pos_++];
      if (c == quote) {
        if (quote == '\'' && Peek() == '\'') {  // '' is an escaped quote
          out.push_back('\'');
          ++pos_;
          continue;
        }
        return out;
      }
      if (quote == '"' && c == '\\') {
        if (AtEnd()) Fail("unterminated escape");
        char e = text_[pos_++];
        switch (e) {
          case '"':
            out.push_back('"');
            break;
          case '\\':
            out.push_back('\\');
            break;
          case '/':
            out.push_back('/');
            break;
          case 'n':
            out.push_back('\n');
            break;
          case 't':
            out.push_back('\t');
            break;
          case 'r':
            out.push_back('\r');
            break;
          case '0':
            out.push_back('\0');
            break;
          default:
            Fail(std::string("unsupported escape '\\") + e + "'");
        }
        continue;
      }
      out.push_back(c);
    }
  }

  // Types a plain scalar: null, boolean, number or string.
  Value TypePlain(std::string_view s, int line) {
    Value v;
    v.line = line;
    if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return v;
    if (s == "true" || s == "True" || s == "TRUE" || s == "false" || s == "False" || s == "FALSE") {
      v.kind = Value::Kind::kBool;
      v.text = (s[0] == 't' || s[0] == 'T') ? "true" : "false";
      return v;
    }
    v.text = std::string(s);
    v.kind = Value::Kind::kString;
    char c0 = s[0];
    if ((c0 >= '0' && c0 <= '9') || c0 == '-' || c0 == '+' || c0 == '.') {
      char* end = nullptr;
      std::strtod(v.text.c_str(), &end);
      bool alpha = false;  // reject "inf", "nan", hex: digits, sign, '.', 'e' only
      for (char ch : s) {
        alpha |= !((ch >= '0' && ch <= '9') || ch == '-' || ch == '+' || ch == '.' || ch == 'e' ||
                   ch == 'E');
      }
      if (end == v.text.c_str() + v.text.size() && !alpha) v.kind = Value::Kind::kNumber;
    }
    return v;
  }

  std::string_view text_;
  const std::string& source_;
  size_t pos_ = 0;
};

}  // namespace

Value ParseYaml(std::string_view text, const std::string& source) {
  return YamlParser(text, source).ParseDocument();
}

}  // namespace loom::train
