// A structure-aware mutator for protobuf inputs (libprotobuf-mutator is not packaged in Debian
// 12): MutateMessage makes one change to a message by reflection — a field set to a value from a
// list of the ones validators get wrong (0, -1, 2^53 + 1, INT_MAX, NaN, infinities, "..", NUL,
// loader variables, 5,000-byte strings, unknown enum numbers) or a random one, a message field
// cleared or descended into, a repeated or map field grown, shrunk or one element changed.
// Byte-level mutation of wire bytes rarely keeps a message parseable past its first change;
// this keeps every input a valid message, so the fuzzer's time goes to the code under test.
//
// MutateProtoInput is the body of a target's LLVMFuzzerCustomMutator: it parses the input's
// message (JSON when it starts with '{', else wire bytes), mutates it a few times and writes it
// back in the same form; a fixed-size tail (bytes a target reads for other purposes) is kept.
// One call in four is left to libFuzzer's own byte mutations, which reach what a structural
// change cannot (truncated and malformed encodings).
#ifndef LOOM_TESTS_FUZZ_PROTO_MUTATOR_H_
#define LOOM_TESTS_FUZZ_PROTO_MUTATOR_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/reflection.h"
#include "google/protobuf/util/json_util.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace loom::fuzz {

using Rng = std::mt19937_64;

inline size_t Pick(Rng& rng, size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); }

inline int64_t InterestingInt(Rng& rng) {
  static const int64_t kValues[] = {0,
                                    1,
                                    -1,
                                    2,
                                    3,
                                    7,
                                    8,
                                    16,
                                    1024,
                                    65536,
                                    std::numeric_limits<int32_t>::max(),
                                    std::numeric_limits<int32_t>::min(),
                                    int64_t{1} << 53,
                                    (int64_t{1} << 53) + 1,
                                    std::numeric_limits<int64_t>::max(),
                                    std::numeric_limits<int64_t>::min()};
  if (rng() % 4 == 0) return static_cast<int64_t>(rng());
  return kValues[Pick(rng, sizeof(kValues) / sizeof(kValues[0]))];
}

inline double InterestingDouble(Rng& rng) {
  static const double kValues[] = {0.0,
                                   -0.0,
                                   1.0,
                                   -1.0,
                                   0.5,
                                   6e-4,
                                   1e-300,
                                   1e300,
                                   std::numeric_limits<double>::infinity(),
                                   -std::numeric_limits<double>::infinity(),
                                   std::numeric_limits<double>::quiet_NaN(),
                                   std::numeric_limits<double>::denorm_min()};
  if (rng() % 4 == 0) return std::ldexp(static_cast<double>(rng() % 2000001) - 1e6, -10);
  return kValues[Pick(rng, sizeof(kValues) / sizeof(kValues[0]))];
}

inline std::string InterestingString(Rng& rng, const std::string& old) {
  static const char* const kValues[] = {"",
                                        "a",
                                        "tiny",
                                        "gpt2-124m",
                                        "tiny-corpus",
                                        "bf16",
                                        "fp32",
                                        "1f1b",
                                        "gpipe",
                                        "/data/train.bin",
                                        "/shared/checkpoints/run",
                                        "/data/../etc/shadow",
                                        "../../x",
                                        "/etc/shadow",
                                        "LD_PRELOAD",
                                        "PATH",
                                        "PYTHONPATH",
                                        "OMP_NUM_THREADS",
                                        "jobs/x",
                                        "nodes/n1",
                                        "$",
                                        "user:a",
                                        " ",
                                        "\xff\xfe",
                                        "ß\t"};
  switch (rng() % 6) {
    case 0:
      return std::string(5000, 'x');
    case 1: {
      std::string s = old;  // one byte inserted, removed or changed
      const size_t at = Pick(rng, s.size() + 1);
      if (rng() % 2 == 0 || s.empty()) {
        s.insert(s.begin() + static_cast<long>(at), static_cast<char>(rng()));
      } else {
        s.erase(std::min(at, s.size() - 1), 1);
      }
      return s;
    }
    case 2:
      return std::string("a\0b", 3);
    default:
      return kValues[Pick(rng, sizeof(kValues) / sizeof(kValues[0]))];
  }
}

// Sets the singular scalar `field` of `m`, or adds an element to it when it is repeated.
inline void SetScalar(google::protobuf::Message* m, const google::protobuf::FieldDescriptor* f,
                      Rng& rng) {
  using FD = google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m->GetReflection();
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case FD::CPPTYPE_INT32: {
      const auto v = static_cast<int32_t>(InterestingInt(rng));
      rep ? r->AddInt32(m, f, v) : r->SetInt32(m, f, v);
      break;
    }
    case FD::CPPTYPE_INT64: {
      const int64_t v = InterestingInt(rng);
      rep ? r->AddInt64(m, f, v) : r->SetInt64(m, f, v);
      break;
    }
    case FD::CPPTYPE_UINT32: {
      const auto v = static_cast<uint32_t>(InterestingInt(rng));
      rep ? r->AddUInt32(m, f, v) : r->SetUInt32(m, f, v);
      break;
    }
    case FD::CPPTYPE_UINT64: {
      const auto v = static_cast<uint64_t>(InterestingInt(rng));
      rep ? r->AddUInt64(m, f, v) : r->SetUInt64(m, f, v);
      break;
    }
    case FD::CPPTYPE_DOUBLE: {
      const double v = InterestingDouble(rng);
      rep ? r->AddDouble(m, f, v) : r->SetDouble(m, f, v);
      break;
    }
    case FD::CPPTYPE_FLOAT: {
      const auto v = static_cast<float>(InterestingDouble(rng));
      rep ? r->AddFloat(m, f, v) : r->SetFloat(m, f, v);
      break;
    }
    case FD::CPPTYPE_BOOL: {
      const bool v = rep ? rng() % 2 == 0 : !r->GetBool(*m, f);
      rep ? r->AddBool(m, f, v) : r->SetBool(m, f, v);
      break;
    }
    case FD::CPPTYPE_ENUM: {
      const google::protobuf::EnumDescriptor* e = f->enum_type();
      // Mostly a named value; sometimes a number no value has (proto3 enums keep it).
      const int v = rng() % 4 == 0
                        ? static_cast<int>(InterestingInt(rng) % 1000)
                        : e->value(static_cast<int>(Pick(rng, e->value_count())))->number();
      rep ? r->AddEnumValue(m, f, v) : r->SetEnumValue(m, f, v);
      break;
    }
    case FD::CPPTYPE_STRING: {
      const std::string old = rep ? std::string() : r->GetString(*m, f);
      std::string v = InterestingString(rng, old);
      rep ? r->AddString(m, f, std::move(v)) : r->SetString(m, f, std::move(v));
      break;
    }
    case FD::CPPTYPE_MESSAGE:
      break;  // not a scalar
  }
}

// One random change to `m` (see the file comment). `depth` bounds the descent.
inline void MutateMessage(google::protobuf::Message* m, Rng& rng, int depth = 0) {
  using FD = google::protobuf::FieldDescriptor;
  const google::protobuf::Descriptor* d = m->GetDescriptor();
  if (d->field_count() == 0) return;
  const FD* f = d->field(static_cast<int>(Pick(rng, d->field_count())));
  const google::protobuf::Reflection* r = m->GetReflection();
  if (f->is_repeated()) {
    const int size = r->FieldSize(*m, f);
    const int what = static_cast<int>(rng() % 4);
    if (what == 0 && size > 0) {
      r->RemoveLast(m, f);
    } else if (what == 1 && size > 0 && f->cpp_type() == FD::CPPTYPE_MESSAGE && depth < 8) {
      MutateMessage(r->MutableRepeatedMessage(m, f, static_cast<int>(Pick(rng, size))), rng,
                    depth + 1);
    } else if (f->cpp_type() == FD::CPPTYPE_MESSAGE) {
      google::protobuf::Message* added = r->AddMessage(m, f);
      // A map entry gets its key and value; another message one change.
      const int changes = f->is_map() ? 2 : 1;
      for (int i = 0; i < changes && depth < 8; ++i) {
        if (f->is_map()) {
          const FD* part = added->GetDescriptor()->field(i);
          if (part->cpp_type() == FD::CPPTYPE_MESSAGE) {
            MutateMessage(added->GetReflection()->MutableMessage(added, part), rng, depth + 1);
          } else {
            SetScalar(added, part, rng);
          }
        } else {
          MutateMessage(added, rng, depth + 1);
        }
      }
    } else {
      SetScalar(m, f, rng);
    }
    return;
  }
  if (f->cpp_type() == FD::CPPTYPE_MESSAGE) {
    if (rng() % 8 == 0 || depth >= 8) {
      r->ClearField(m, f);
    } else {
      MutateMessage(r->MutableMessage(m, f), rng, depth + 1);
    }
    return;
  }
  if (rng() % 8 == 0) {
    r->ClearField(m, f);  // back to absent (optional fields) or the default
    return;
  }
  SetScalar(m, f, rng);
}

// The body of LLVMFuzzerCustomMutator for targets whose input is a message `M` followed by
// `tail` bytes the target reads for something else (kept, and sometimes one of them changed).
template <typename M>
size_t MutateProtoInput(uint8_t* data, size_t size, size_t max_size, unsigned int seed,
                        size_t tail) {
  Rng rng(seed);
  // LOOM_FUZZ_BYTES_ONLY=1: libFuzzer's byte mutations alone, to compare the two side by side.
  static const bool bytes_only = std::getenv("LOOM_FUZZ_BYTES_ONLY") != nullptr;
  if (bytes_only || rng() % 4 == 0 || size < tail) return LLVMFuzzerMutate(data, size, max_size);
  const std::string text(reinterpret_cast<const char*>(data), size - tail);
  std::string end(reinterpret_cast<const char*>(data) + size - tail, tail);
  M message;
  const bool json = !text.empty() && text[0] == '{';
  if (json) {
    if (!google::protobuf::util::JsonStringToMessage(text, &message).ok()) message.Clear();
  } else if (!message.ParseFromString(text)) {
    message.Clear();
  }
  const int changes = 1 + static_cast<int>(rng() % 3);
  for (int i = 0; i < changes; ++i) MutateMessage(&message, rng);
  if (!end.empty() && rng() % 8 == 0) end[Pick(rng, end.size())] = static_cast<char>(rng());
  std::string out;
  if (json) {
    // NaN and infinities have no JSON form: such a change is dropped by the printer's error.
    if (!google::protobuf::util::MessageToJsonString(message, &out).ok()) {
      return LLVMFuzzerMutate(data, size, max_size);
    }
  } else if (!message.SerializeToString(&out)) {
    return LLVMFuzzerMutate(data, size, max_size);
  }
  out += end;
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

}  // namespace loom::fuzz

#endif  // LOOM_TESTS_FUZZ_PROTO_MUTATOR_H_
