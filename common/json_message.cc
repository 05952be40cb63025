#include "common/json_message.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace loom {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using nlohmann::json;

absl::Status Bad(const std::string& path, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", problem));
}

std::string Join(const std::string& path, const std::string& key) {
  return path.empty() ? key : absl::StrCat(path, ".", key);
}

// The integer in `v` when it lies in [lo, hi]; false otherwise (not an integer, or outside).
bool IntegerIn(const json& v, int64_t lo, int64_t hi, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (!v.is_number_integer()) return false;
  *out = v.get<int64_t>();
  return *out >= lo && *out <= hi;
}

bool Unsigned(const json& v, uint64_t hi, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
  } else if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
  } else {
    return false;
  }
  return *out <= hi;
}

// A double as the converter writes it: a number, or one of JSON's names for NaN and infinity.
bool Double(const json& v, double* out) {
  if (v.is_number()) {
    *out = v.get<double>();
    return true;
  }
  if (!v.is_string()) return false;
  const std::string& s = v.get_ref<const std::string&>();
  if (s == "NaN") {
    *out = std::numeric_limits<double>::quiet_NaN();
  } else if (s == "Infinity") {
    *out = std::numeric_limits<double>::infinity();
  } else if (s == "-Infinity") {
    *out = -std::numeric_limits<double>::infinity();
  } else {
    return false;
  }
  return true;
}

absl::Status SetMessage(const json& tree, Message* m, const std::string& path);

// Sets (or, for a repeated field, adds) one value of the non-message field `f`.
absl::Status SetScalar(const json& v, const FieldDescriptor* f, Message* m,
                       const std::string& path) {
  const Reflection* r = m->GetReflection();
  const bool add = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      int64_t i = 0;
      if (!IntegerIn(v, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
                     &i)) {
        return Bad(path, "expected a 32-bit integer");
      }
      add ? r->AddInt32(m, f, static_cast<int32_t>(i)) : r->SetInt32(m, f, static_cast<int32_t>(i));
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t i = 0;
      if (!IntegerIn(v, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                     &i)) {
        return Bad(path, "expected a 64-bit integer");
      }
      add ? r->AddInt64(m, f, i) : r->SetInt64(m, f, i);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      uint64_t u = 0;
      if (!Unsigned(v, std::numeric_limits<uint32_t>::max(), &u)) {
        return Bad(path, "expected an unsigned 32-bit integer");
      }
      add ? r->AddUInt32(m, f, static_cast<uint32_t>(u))
          : r->SetUInt32(m, f, static_cast<uint32_t>(u));
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t u = 0;
      if (!Unsigned(v, std::numeric_limits<uint64_t>::max(), &u)) {
        return Bad(path, "expected an unsigned 64-bit integer");
      }
      add ? r->AddUInt64(m, f, u) : r->SetUInt64(m, f, u);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      double d = 0;
      if (!Double(v, &d)) return Bad(path, "expected a number");
      add ? r->AddDouble(m, f, d) : r->SetDouble(m, f, d);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_FLOAT: {
      double d = 0;
      if (!Double(v, &d)) return Bad(path, "expected a number");
      if (std::isfinite(d) && std::fabs(d) > std::numeric_limits<float>::max()) {
        return Bad(path, absl::StrCat(v.dump(), " is out of range for a float"));
      }
      add ? r->AddFloat(m, f, static_cast<float>(d)) : r->SetFloat(m, f, static_cast<float>(d));
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_BOOL:
      if (!v.is_boolean()) return Bad(path, "expected true or false");
      add ? r->AddBool(m, f, v.get<bool>()) : r->SetBool(m, f, v.get<bool>());
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_STRING:
      if (!v.is_string()) return Bad(path, "expected a string");
      add ? r->AddString(m, f, v.get<std::string>()) : r->SetString(m, f, v.get<std::string>());
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_ENUM: {
      const EnumValueDescriptor* e =
          v.is_string() ? f->enum_type()->FindValueByName(v.get_ref<const std::string&>())
                        : nullptr;
      if (e == nullptr)
        return Bad(path, absl::StrCat("no value ", v.dump(), " in ", f->enum_type()->full_name()));
      add ? r->AddEnum(m, f, e) : r->SetEnum(m, f, e);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return Bad(path, "not a scalar field");
}

// One value of field `f`: a message is set (or added) and filled, a scalar set (or added).
absl::Status SetValue(const json& v, const FieldDescriptor* f, Message* m,
                      const std::string& path) {
  if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) return SetScalar(v, f, m, path);
  const Reflection* r = m->GetReflection();
  Message* sub = f->is_repeated() ? r->AddMessage(m, f) : r->MutableMessage(m, f);
  if (f->message_type()->file()->package() == "google.protobuf") {
    // A well-known type, in its own JSON form (Timestamp as RFC 3339 text and so on).
    const auto status = google::protobuf::util::JsonStringToMessage(v.dump(), sub);
    if (!status.ok()) return Bad(path, std::string(status.message()));
    return absl::OkStatus();
  }
  return SetMessage(v, sub, path);
}

// A map entry's key from its JSON object key, in the key field's type.
absl::Status SetMapKey(const std::string& key, const FieldDescriptor* f, Message* entry,
                       const std::string& path) {
  const Reflection* r = entry->GetReflection();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      r->SetString(entry, f, key);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_BOOL:
      if (key != "true" && key != "false") return Bad(path, "a map key must be true or false");
      r->SetBool(entry, f, key == "true");
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t i = 0;
      if (!absl::SimpleAtoi(key, &i)) return Bad(path, "a map key must be an integer");
      return SetScalar(json(i), f, entry, path);
    }
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t u = 0;
      if (!absl::SimpleAtoi(key, &u)) return Bad(path, "a map key must be an unsigned integer");
      return SetScalar(json(u), f, entry, path);
    }
    default:
      return Bad(path, "this map's key type cannot come from JSON");
  }
}

absl::Status SetMessage(const json& tree, Message* m, const std::string& path) {
  if (!tree.is_object()) return Bad(path.empty() ? "(top level)" : path, "expected an object");
  const Descriptor* d = m->GetDescriptor();
  const Reflection* r = m->GetReflection();
  for (const auto& [key, value] : tree.items()) {
    const std::string key_path = Join(path, key);
    const FieldDescriptor* f = FieldByEitherName(d, key);
    if (f == nullptr) return Bad(key_path, absl::StrCat("no such field in ", d->full_name()));
    if (f->containing_oneof() != nullptr && r->HasOneof(*m, f->containing_oneof())) {
      return Bad(key_path, absl::StrCat("another field of the oneof '",
                                        f->containing_oneof()->name(), "' is already set"));
    }
    if (f->is_map()) {
      if (!value.is_object()) return Bad(key_path, "expected an object");
      const FieldDescriptor* key_field = f->message_type()->map_key();
      const FieldDescriptor* value_field = f->message_type()->map_value();
      for (const auto& [map_key, map_value] : value.items()) {
        const std::string entry_path = Join(key_path, map_key);
        Message* entry = r->AddMessage(m, f);
        if (absl::Status s = SetMapKey(map_key, key_field, entry, entry_path); !s.ok()) return s;
        if (absl::Status s = SetValue(map_value, value_field, entry, entry_path); !s.ok()) {
          return s;
        }
      }
    } else if (f->is_repeated()) {
      if (!value.is_array()) return Bad(key_path, "expected an array");
      for (size_t i = 0; i < value.size(); ++i) {
        if (absl::Status s = SetValue(value[i], f, m, absl::StrCat(key_path, "[", i, "]"));
            !s.ok()) {
          return s;
        }
      }
    } else if (absl::Status s = SetValue(value, f, m, key_path); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

const FieldDescriptor* FieldByEitherName(const Descriptor* d, const std::string& key) {
  if (const FieldDescriptor* f = d->FindFieldByName(key)) return f;
  for (int i = 0; i < d->field_count(); ++i) {
    if (d->field(i)->json_name() == key) return d->field(i);
  }
  return nullptr;
}

absl::Status SetMessageFromCheckedJson(const json& tree, Message* message) {
  return SetMessage(tree, message, "");
}

}  // namespace loom
