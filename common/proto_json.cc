#include "common/proto_json.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace loom {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

nlohmann::json MessageTree(const Message& message);

nlohmann::json DoubleValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}

// The value of a singular field, or of element `index` of a repeated one (index >= 0).
nlohmann::json FieldValue(const Message& m, const FieldDescriptor* f, int index) {
  const Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f);
    case FieldDescriptor::CPPTYPE_UINT32:
      return rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f);
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
    case FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return DoubleValue(rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return DoubleValue(rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f);
    case FieldDescriptor::CPPTYPE_ENUM: {
      const int number = rep ? r->GetRepeatedEnumValue(m, f, index) : r->GetEnumValue(m, f);
      const auto* value = f->enum_type()->FindValueByNumber(number);
      if (value == nullptr) return number;
      return value->name();
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string scratch;
      const std::string& s = rep ? r->GetRepeatedStringReference(m, f, index, &scratch)
                                 : r->GetStringReference(m, f, &scratch);
      if (f->type() == FieldDescriptor::TYPE_BYTES) return absl::Base64Escape(s);
      return s;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return MessageTree(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
  }
  return nullptr;
}

// A map entry's key as an object key: its text (protobuf's mapping for every key type).
std::string MapKey(const Message& entry) {
  const FieldDescriptor* key = entry.GetDescriptor()->map_key();
  const nlohmann::json value = FieldValue(entry, key, -1);
  if (value.is_string()) return value.get<std::string>();
  return value.dump();  // integers and booleans
}

nlohmann::json MessageTree(const Message& message) {
  nlohmann::json out = nlohmann::json::object();
  const google::protobuf::Descriptor* d = message.GetDescriptor();
  const Reflection* r = message.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_map()) {
      nlohmann::json map = nlohmann::json::object();
      const FieldDescriptor* value = f->message_type()->map_value();
      for (int k = 0; k < r->FieldSize(message, f); ++k) {
        const Message& entry = r->GetRepeatedMessage(message, f, k);
        map[MapKey(entry)] = FieldValue(entry, value, -1);
      }
      out[f->name()] = std::move(map);
    } else if (f->is_repeated()) {
      nlohmann::json list = nlohmann::json::array();
      for (int k = 0; k < r->FieldSize(message, f); ++k) list.push_back(FieldValue(message, f, k));
      out[f->name()] = std::move(list);
    } else if (!f->has_presence() || r->HasField(message, f)) {
      out[f->name()] = FieldValue(message, f, -1);
    }
  }
  return out;
}

}  // namespace

std::string MessageToJson(const Message& message) {
  // replace: never throw on bytes that are not UTF-8 (proto3 parsing refuses them anyway).
  return MessageTree(message).dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace loom
