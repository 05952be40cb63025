#include "worker/agent/progress_parser.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace loom::worker {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

// Progress lines are short; anything much larger is not a progress line.
constexpr size_t kMaxLineBytes = 64 * 1024;
// Integers travel as JSON numbers (doubles): accept what a double represents exactly.
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

const Value* Find(const Struct& s, const char* key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? nullptr : &it->second;
}

// Reads an optional finite number; absent or null leaves `out` unchanged.
absl::Status ReadDouble(const Struct& s, const char* key, double* out) {
  const Value* v = Find(s, key);
  if (v == nullptr || v->kind_case() == Value::kNullValue) return absl::OkStatus();
  if (v->kind_case() != Value::kNumberValue || !std::isfinite(v->number_value())) {
    return absl::InvalidArgumentError(absl::StrCat("field \"", key, "\" must be a finite number"));
  }
  *out = v->number_value();
  return absl::OkStatus();
}

// Reads an optional non-negative integer.
absl::Status ReadCount(const Struct& s, const char* key, int64_t* out) {
  double d = -1;
  const Value* v = Find(s, key);
  if (v == nullptr || v->kind_case() == Value::kNullValue) return absl::OkStatus();
  if (!ReadDouble(s, key, &d).ok() || d < 0 || d > kMaxExactInteger || d != std::floor(d)) {
    return absl::InvalidArgumentError(
        absl::StrCat("field \"", key, "\" must be a non-negative integer"));
  }
  *out = static_cast<int64_t>(d);
  return absl::OkStatus();
}

absl::Status ReadBytes(const Struct& s, const char* key, uint64_t* out) {
  int64_t n = 0;
  if (Find(s, key) == nullptr) return absl::OkStatus();
  absl::Status st = ReadCount(s, key, &n);
  if (!st.ok()) return st;
  *out = static_cast<uint64_t>(n);
  return absl::OkStatus();
}

// Reads the optional "device" field: "cpu" or "cuda:N" from loom-train. Only its "cuda" prefix
// matters upstream (it is never a label value), but the length is bounded all the same.
absl::Status ReadDevice(const Struct& s, std::string* out) {
  constexpr size_t kMaxDeviceChars = 64;
  const Value* v = Find(s, "device");
  if (v == nullptr || v->kind_case() == Value::kNullValue) return absl::OkStatus();
  if (v->kind_case() != Value::kStringValue || v->string_value().size() > kMaxDeviceChars) {
    return absl::InvalidArgumentError(absl::StrCat("field \"device\" must be a string of at most ",
                                                   kMaxDeviceChars, " characters"));
  }
  *out = v->string_value();
  return absl::OkStatus();
}

// Reads a JSON array of at most `max` non-negative finite numbers.
absl::Status ReadSeconds(const Value& v, const std::string& field, size_t max,
                         std::vector<double>* out) {
  if (v.kind_case() != Value::kListValue ||
      static_cast<size_t>(v.list_value().values_size()) > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field \"", field, "\" must be an array of at most ", max, " non-negative numbers"));
  }
  for (const Value& e : v.list_value().values()) {
    if (e.kind_case() != Value::kNumberValue || !std::isfinite(e.number_value()) ||
        e.number_value() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("field \"", field, "\" must hold non-negative finite numbers"));
    }
    out->push_back(e.number_value());
  }
  return absl::OkStatus();
}

// Reads the optional "block_seconds" object of a sampled step (docs/rank-contract.md).
absl::Status ReadBlockSeconds(const Struct& s, loom::v1::StepReport* report) {
  // More blocks than any model the planner knows; bounds the report's size.
  constexpr size_t kMaxBlocks = 1024;
  const Value* v = Find(s, "block_seconds");
  if (v == nullptr || v->kind_case() == Value::kNullValue) return absl::OkStatus();
  if (v->kind_case() != Value::kStructValue) {
    return absl::InvalidArgumentError("field \"block_seconds\" must be an object");
  }
  const Struct& b = v->struct_value();
  loom::v1::BlockCosts* costs = report->mutable_block_costs();
  int64_t first = 0;
  if (absl::Status e = ReadCount(b, "first_block", &first); !e.ok() || first > 1 << 20) {
    return absl::InvalidArgumentError(
        "field \"block_seconds.first_block\" must be a non-negative integer");
  }
  costs->set_first_block(static_cast<int32_t>(first));
  std::vector<double> fwd, bwd;
  const Value* f = Find(b, "forward");
  const Value* w = Find(b, "backward");
  if (f == nullptr || w == nullptr) {
    return absl::InvalidArgumentError(
        "field \"block_seconds\" needs both \"forward\" and \"backward\"");
  }
  if (absl::Status e = ReadSeconds(*f, "block_seconds.forward", kMaxBlocks, &fwd); !e.ok()) {
    return e;
  }
  if (absl::Status e = ReadSeconds(*w, "block_seconds.backward", kMaxBlocks, &bwd); !e.ok()) {
    return e;
  }
  if (fwd.size() != bwd.size()) {
    return absl::InvalidArgumentError(
        "fields \"block_seconds.forward\" and \"block_seconds.backward\" must be the same length");
  }
  *costs->mutable_forward_seconds() = {fwd.begin(), fwd.end()};
  *costs->mutable_backward_seconds() = {bwd.begin(), bwd.end()};
  for (const char* part : {"embedding", "head"}) {
    const Value* p = Find(b, part);
    if (p == nullptr || p->kind_case() == Value::kNullValue) continue;
    std::vector<double> fb;
    const std::string field = absl::StrCat("block_seconds.", part);
    if (absl::Status e = ReadSeconds(*p, field, 2, &fb); !e.ok()) return e;
    if (fb.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("field \"", field, "\" must be [forward, backward] seconds"));
    }
    if (std::string_view(part) == "embedding") {
      costs->set_has_embedding(true);
      costs->set_embedding_forward_seconds(fb[0]);
      costs->set_embedding_backward_seconds(fb[1]);
    } else {
      costs->set_has_head(true);
      costs->set_head_forward_seconds(fb[0]);
      costs->set_head_backward_seconds(fb[1]);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<loom::v1::StepReport>> ParseProgressLine(std::string_view line) {
  if (line.size() > kMaxLineBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("progress line of ", line.size(), " bytes exceeds ", kMaxLineBytes));
  }
  Struct obj;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  const auto parsed = google::protobuf::util::JsonStringToMessage(std::string(line), &obj, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("progress line is not a JSON object: ", std::string(parsed.message())));
  }
  const Value* event = Find(obj, "event");
  if (event == nullptr || event->kind_case() != Value::kStringValue) {
    return absl::InvalidArgumentError("progress line has no string field \"event\"");
  }
  const std::string& kind = event->string_value();
  if (kind != "step" && kind != "eval" && kind != "checkpoint") {
    return std::optional<loom::v1::StepReport>();
  }

  loom::v1::StepReport report;
  int64_t step = 0, total_steps = 0;
  if (Find(obj, "step") == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("\"", kind, "\" line has no field \"step\""));
  }
  absl::Status st = ReadCount(obj, "step", &step);
  if (st.ok()) st = ReadCount(obj, "total_steps", &total_steps);
  if (!st.ok()) return st;
  report.set_step(step);
  report.set_total_steps(total_steps);

  if (kind == "checkpoint") {
    // Progress for loomd's watchdog: a checkpoint of `step` was written.
    report.set_checkpoint(true);
    // How long the save took (optional; older ranks do not say): loomd's goodput accounting.
    double seconds = 0;
    if (absl::Status e = ReadDouble(obj, "seconds", &seconds); !e.ok()) return e;
    if (seconds < 0 || seconds > 86400) {
      return absl::InvalidArgumentError("field \"seconds\" must be in [0, 86400]");
    }
    report.set_checkpoint_seconds(seconds);
    return std::optional<loom::v1::StepReport>(std::move(report));
  }
  if (kind == "eval") {
    double val_loss = 0;
    if (Find(obj, "val_loss") == nullptr) {
      return absl::InvalidArgumentError("\"eval\" line has no field \"val_loss\"");
    }
    if (absl::Status e = ReadDouble(obj, "val_loss", &val_loss); !e.ok()) return e;
    report.set_has_val_loss(true);
    report.set_val_loss(val_loss);
    return std::optional<loom::v1::StepReport>(std::move(report));
  }

  double loss = 0, lr = 0, grad_norm = 0, tps = 0, step_seconds = 0;
  uint64_t memory = 0, peak = 0;
  for (auto [key, out] :
       {std::pair{"loss", &loss}, std::pair{"lr", &lr}, std::pair{"grad_norm", &grad_norm},
        std::pair{"tokens_per_second", &tps}, std::pair{"step_seconds", &step_seconds}}) {
    if (absl::Status e = ReadDouble(obj, key, out); !e.ok()) return e;
  }
  if (absl::Status e = ReadBytes(obj, "memory_bytes", &memory); !e.ok()) return e;
  if (absl::Status e = ReadBytes(obj, "peak_memory_bytes", &peak); !e.ok()) return e;
  report.set_loss(loss);
  report.set_lr(lr);
  report.set_grad_norm(grad_norm);
  report.set_tokens_per_second(tps);
  report.set_step_seconds(step_seconds);
  report.set_memory_bytes(memory);
  report.set_peak_memory_bytes(peak);

  if (const Value* phases = Find(obj, "phases");
      phases != nullptr && phases->kind_case() != Value::kNullValue) {
    if (phases->kind_case() != Value::kStructValue) {
      return absl::InvalidArgumentError("field \"phases\" must be an object of numbers");
    }
    // Phase names become Prometheus label values upstream: keep them bounded.
    if (phases->struct_value().fields_size() > 32) {
      return absl::InvalidArgumentError("field \"phases\" has more than 32 entries");
    }
    for (const auto& [name, v] : phases->struct_value().fields()) {
      if (name.empty() || name.size() > 64 || v.kind_case() != Value::kNumberValue ||
          !std::isfinite(v.number_value())) {
        return absl::InvalidArgumentError(
            absl::StrCat("field \"phases\": entry \"", name.substr(0, 64),
                         "\" must be a finite number with a name of 1..64 characters"));
      }
      (*report.mutable_phase_seconds())[name] = v.number_value();
    }
  }
  if (const Value* bytes = Find(obj, "comm_bytes");
      bytes != nullptr && bytes->kind_case() != Value::kNullValue) {
    if (bytes->kind_case() != Value::kStructValue) {
      return absl::InvalidArgumentError("field \"comm_bytes\" must be an object of counts");
    }
    // Collective kinds become label values upstream: keep them bounded.
    if (bytes->struct_value().fields_size() > 16) {
      return absl::InvalidArgumentError("field \"comm_bytes\" has more than 16 entries");
    }
    for (const auto& [name, v] : bytes->struct_value().fields()) {
      uint64_t n = 0;
      if (name.empty() || name.size() > 64 ||
          !ReadBytes(bytes->struct_value(), name.c_str(), &n).ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("field \"comm_bytes\": entry \"", name.substr(0, 64),
                         "\" must be a non-negative integer with a name of 1..64 characters"));
      }
      (*report.mutable_comm_bytes())[name] = n;
    }
  }
  double overlap = 0, bubble = 0, idle = 0;
  for (auto [key, out] : {std::pair{"overlap_ratio", &overlap}, std::pair{"bubble_ratio", &bubble},
                          std::pair{"idle_ratio", &idle}}) {
    if (absl::Status e = ReadDouble(obj, key, out); !e.ok()) return e;
    if (*out < 0.0 || *out > 1.0) {
      return absl::InvalidArgumentError(absl::StrCat("field \"", key, "\" must be in [0, 1]"));
    }
  }
  report.set_overlap_ratio(overlap);
  report.set_bubble_ratio(bubble);
  report.set_idle_ratio(idle);

  // The profiler's memory statistics; ranks older than them leave them out (0 and "").
  uint64_t rss = 0, reserved = 0, device_allocations = 0;
  for (auto [key, out] :
       {std::pair{"rss_bytes", &rss}, std::pair{"reserved_memory_bytes", &reserved},
        std::pair{"device_allocations", &device_allocations}}) {
    if (absl::Status e = ReadBytes(obj, key, out); !e.ok()) return e;
  }
  double fragmentation = 0;
  if (absl::Status e = ReadDouble(obj, "memory_fragmentation", &fragmentation); !e.ok()) return e;
  if (fragmentation < 0.0 || fragmentation > 1.0) {
    return absl::InvalidArgumentError("field \"memory_fragmentation\" must be in [0, 1]");
  }
  std::string device;
  if (absl::Status e = ReadDevice(obj, &device); !e.ok()) return e;
  report.set_rss_bytes(rss);
  report.set_reserved_memory_bytes(reserved);
  report.set_memory_fragmentation(fragmentation);
  report.set_device_allocations(device_allocations);
  report.set_device(std::move(device));
  if (absl::Status e = ReadBlockSeconds(obj, &report); !e.ok()) return e;
  return std::optional<loom::v1::StepReport>(std::move(report));
}

}  // namespace loom::worker
