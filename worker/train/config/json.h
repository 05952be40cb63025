// A small JSON document model, reader and writer: enough for job specs, checkpoint manifests and
// safetensors headers, with no third-party library (the GPU machine has none).
//
// Numbers keep their literal text, so int64 values round-trip exactly and the caller decides the
// type. Object members keep document order; duplicate keys are an error.
#ifndef LOOM_WORKER_TRAIN_CONFIG_JSON_H_
#define LOOM_WORKER_TRAIN_CONFIG_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::train {

struct Value {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  // Declared here and defaulted below the class, where Value is complete: `members` holds
  // pairs with Value inside, and clang (with libstdc++) instantiates the vector's destructor
  // at an in-class default, while Value is still incomplete, and fails to compile.
  Value();
  Value(const Value&);
  Value(Value&&) noexcept;
  Value& operator=(const Value&);
  Value& operator=(Value&&) noexcept;
  ~Value();

  Kind kind = Kind::kNull;
  // kString: the decoded string; kNumber: the literal as written; kBool: "true" or "false".
  std::string text;
  std::vector<Value> items;                            // kArray
  std::vector<std::pair<std::string, Value>> members;  // kObject, in document order
  int line = 0;                                        // 1-based source line, 0 if unknown

  // The member named `key`, or nullptr (also when this is not an object).
  const Value* Find(std::string_view key) const;
  bool is_object() const { return kind == Kind::kObject; }
};

inline Value::Value() = default;
inline Value::Value(const Value&) = default;
inline Value::Value(Value&&) noexcept = default;
inline Value& Value::operator=(const Value&) = default;
inline Value& Value::operator=(Value&&) noexcept = default;
inline Value::~Value() = default;

// A short human name of a kind ("object", "string", ...), for error messages.
const char* KindName(Value::Kind kind);

// Parses one JSON document (RFC 8259; trailing content other than whitespace is an error).
// `source` names the document in errors. Throws InputError "source:line:col: what".
Value ParseJson(std::string_view text, const std::string& source);

// Reads the whole file at `path`. Throws InputError "path: <reason>" when it cannot.
std::string ReadFileOrThrow(const std::string& path);

// Appends `s` to `out` as a JSON string literal (quotes and escapes included).
void AppendJsonString(std::string* out, std::string_view s);

// The shortest decimal text that reads back as exactly `x` ("null" for NaN or infinity, which
// JSON cannot carry).
std::string JsonNumber(double x);

// Builds one JSON object incrementally: JsonObject o; o.Add("step", 3); o.str().
class JsonObject {
 public:
  JsonObject& Add(std::string_view key, std::string_view value);
  JsonObject& Add(std::string_view key, const char* value) {
    return Add(key, std::string_view(value));
  }
  JsonObject& Add(std::string_view key, const std::string& value) {
    return Add(key, std::string_view(value));
  }
  JsonObject& Add(std::string_view key, double value);
  JsonObject& Add(std::string_view key, int64_t value);
  JsonObject& Add(std::string_view key, int value) { return Add(key, int64_t{value}); }
  JsonObject& Add(std::string_view key, uint64_t value);
  JsonObject& Add(std::string_view key, bool value);
  // Adds `raw_json` verbatim (it must already be valid JSON, e.g. a nested JsonObject's str()).
  JsonObject& AddRaw(std::string_view key, std::string_view raw_json);
  std::string str() const { return body_ + "}"; }

 private:
  void Key(std::string_view key);
  std::string body_ = "{";
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CONFIG_JSON_H_
