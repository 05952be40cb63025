#include "worker/train/config/job_config.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "worker/train/config/yaml.h"
#include "worker/train/error.h"

namespace loom::train {

std::string SnakeCase(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c >= 'A' && c <= 'Z') {
      out.push_back('_');
      out.push_back(static_cast<char>(c - 'A' + 'a'));
    } else {
      out.push_back(c);
    }
  }
  return out;
}

namespace {

// Reads typed fields out of spec objects, naming "source: path.field" in every error.
class SpecReader {
 public:
  explicit SpecReader(const std::string& source) : source_(source) {}

  [[noreturn]] void Fail(const std::string& field, const std::string& what) const {
    throw InputError(source_ + ": " + field + ": " + what);
  }

  // Calls `visit(key, value, field)` for each member of `obj` (an object, or null = empty),
  // with the key in snake_case. A key not in `known` is an error listing the known keys.
  void ForEach(const Value& obj, const std::string& path,
               std::initializer_list<std::string_view> known,
               const std::function<void(const std::string&, const Value&, const std::string&)>&
                   visit) const {
    if (obj.kind == Value::Kind::kNull) return;
    if (obj.kind != Value::Kind::kObject) {
      Fail(path.empty() ? "spec" : path,
           std::string("expected an object, got a ") + KindName(obj.kind));
    }
    std::vector<std::string> seen;
    for (const auto& [raw_key, value] : obj.members) {
      std::string key = SnakeCase(raw_key);
      std::string field = path.empty() ? key : path + "." + key;
      for (const std::string& s : seen) {
        if (s == key) Fail(field, "given twice (in snake_case and lowerCamelCase)");
      }
      seen.push_back(key);
      bool found = false;
      for (std::string_view k : known) found |= (k == key);
      if (!found) {
        std::string list;
        for (std::string_view k : known) list += (list.empty() ? "" : ", ") + std::string(k);
        Fail(path.empty() ? raw_key : path + "." + raw_key,
             "unknown key (expected one of: " + list + ")");
      }
      visit(key, value, field);
    }
  }

  int64_t Int(const Value& v, const std::string& field) const {
    if (v.kind != Value::Kind::kNumber && v.kind != Value::Kind::kString) {
      Fail(field, std::string("expected an integer, got a ") + KindName(v.kind));
    }
    int64_t out = 0;
    const char* first = v.text.data();
    const char* last = first + v.text.size();
    if (first != last && *first == '+') ++first;
    auto [ptr, ec] = std::from_chars(first, last, out);
    if (ec != std::errc() || ptr != last || v.text.empty()) {
      Fail(field, "expected an integer, got \"" + v.text + "\"");
    }
    return out;
  }

  int Int32(const Value& v, const std::string& field) const {
    int64_t x = Int(v, field);
    if (x < -2147483648LL || x > 2147483647LL) Fail(field, "out of the int32 range");
    return static_cast<int>(x);
  }

  double Double(const Value& v, const std::string& field) const {
    if (v.kind != Value::Kind::kNumber && v.kind != Value::Kind::kString) {
      Fail(field, std::string("expected a number, got a ") + KindName(v.kind));
    }
    char* end = nullptr;
    double x = std::strtod(v.text.c_str(), &end);
    if (v.text.empty() || end != v.text.c_str() + v.text.size() || !std::isfinite(x)) {
      Fail(field, "expected a finite number, got \"" + v.text + "\"");
    }
    return x;
  }

  std::string String(const Value& v, const std::string& field) const {
    if (v.kind == Value::Kind::kNull) return "";
    // YAML types plain scalars; a name like 123 is still a string to the spec.
    if (v.kind == Value::Kind::kArray || v.kind == Value::Kind::kObject) {
      Fail(field, std::string("expected a string, got an ") + KindName(v.kind));
    }
    return v.text;
  }

 private:
  const std::string& source_;
};

}  // namespace

JobConfig JobConfigFromValue(const Value& spec, const std::string& source) {
  SpecReader r(source);
  JobConfig c;
  ModelDims explicit_dims;

  r.ForEach(spec, "",
            {"name", "model", "data", "train", "resources", "parallelism", "checkpoint", "restart",
             "priority", "env", "rebalance"},
            [&](const std::string& key, const Value& v, const std::string& field) {
              if (key == "rebalance") {
                // loomd's doctor acts on it (it changes LOOM_LAYOUT); nothing for the rank.
              } else if (key == "name") {
                c.name = r.String(v, field);
              } else if (key == "priority") {
                if (v.kind != Value::Kind::kNull) c.priority = r.Int32(v, field);
              } else if (key == "model") {
                r.ForEach(v, field, {"preset", "layers", "hidden", "heads", "seq_len", "vocab"},
                          [&](const std::string& k, const Value& x, const std::string& f) {
                            if (x.kind == Value::Kind::kNull) return;
                            if (k == "preset") c.preset = r.String(x, f);
                            if (k == "layers") explicit_dims.layers = r.Int32(x, f);
                            if (k == "hidden") explicit_dims.channels = r.Int32(x, f);
                            if (k == "heads") explicit_dims.heads = r.Int32(x, f);
                            if (k == "seq_len") explicit_dims.max_seq_len = r.Int32(x, f);
                            if (k == "vocab") explicit_dims.vocab = r.Int32(x, f);
                          });
              } else if (key == "data") {
                r.ForEach(v, field, {"path", "builtin", "val_path"},
                          [&](const std::string& k, const Value& x, const std::string& f) {
                            if (k == "path") c.data_path = r.String(x, f);
                            if (k == "builtin") c.data_builtin = r.String(x, f);
                            if (k == "val_path") c.val_path = r.String(x, f);
                          });
              } else if (key == "train") {
                r.ForEach(v, field,
                          {"steps", "global_batch_tokens", "lr", "precision", "seed",
                           "warmup_steps", "min_lr_ratio", "weight_decay", "grad_clip",
                           "eval_every", "seq_len", "attention"},
                          [&](const std::string& k, const Value& x, const std::string& f) {
                            if (x.kind == Value::Kind::kNull) return;
                            if (k == "steps") c.steps = r.Int(x, f);
                            if (k == "global_batch_tokens") c.global_batch_tokens = r.Int(x, f);
                            if (k == "lr") c.lr = r.Double(x, f);  // explicit: 0 is refused below
                            if (k == "precision" && !r.String(x, f).empty()) {
                              c.precision = r.String(x, f);
                            }
                            if (k == "seed") {
                              int64_t s = r.Int(x, f);
                              if (s < 0) r.Fail(f, "expected >= 0, got " + std::to_string(s));
                              c.seed = static_cast<uint64_t>(s);  // explicit presence: 0 is 0
                            }
                            if (k == "warmup_steps") c.warmup_steps = r.Int(x, f);
                            if (k == "min_lr_ratio") c.min_lr_ratio = r.Double(x, f);
                            if (k == "weight_decay") c.weight_decay = r.Double(x, f);
                            if (k == "grad_clip") c.grad_clip = r.Double(x, f);
                            if (k == "eval_every") c.eval_every = r.Int(x, f);
                            if (k == "seq_len") c.seq_len = r.Int32(x, f);
                            if (k == "attention" && !r.String(x, f).empty()) {
                              c.attention = r.String(x, f);
                            }
                          });
              } else if (key == "resources") {
                r.ForEach(v, field, {"gpus", "cpu_devices"},
                          [&](const std::string& k, const Value& x, const std::string& f) {
                            if (x.kind == Value::Kind::kNull) return;
                            int n = r.Int32(x, f);
                            if (n < 0) r.Fail(f, "expected >= 0, got " + std::to_string(n));
                            (k == "gpus" ? c.gpus : c.cpu_devices) = n;
                          });
              } else if (key == "parallelism") {
                r.ForEach(v, field,
                          {"auto", "data", "tensor", "pipeline", "micro_batch", "schedule", "zero1",
                           "blocks_per_stage", "dp_bucket_mb", "dp_overlap"},
                          [&](const std::string& k, const Value& x, const std::string& f) {
                            if (x.kind == Value::Kind::kNull) return;
                            if (k == "auto") {
                              r.ForEach(x, f, {}, [](auto&&...) {});  // must be {}
                              c.parallelism_auto = true;
                              return;
                            }
                            // The layout's details: under loom-worker they arrive again in
                            // LOOM_LAYOUT, which decides; here they are only checked.
                            if (k == "schedule") {
                              c.schedule = r.String(x, f);
                              if (!c.schedule.empty() && c.schedule != "1f1b" &&
                                  c.schedule != "gpipe") {
                                r.Fail(f, "expected 1f1b or gpipe, got \"" + c.schedule + "\"");
                              }
                              return;
                            }
                            if (k == "zero1") {
                              if (x.kind != Value::Kind::kBool) {
                                r.Fail(f, "expected true or false");
                              } else {
                                c.zero1 = x.text == "true";
                              }
                              return;
                            }
                            if (k == "dp_bucket_mb") {
                              c.dp_bucket_mb = r.Double(x, f);
                              return;
                            }
                            if (k == "dp_overlap") {
                              // A spec's bool, or a flag's text (--dp-overlap false).
                              if (x.text == "true" || x.text == "1") {
                                c.dp_overlap = true;
                              } else if (x.text == "false" || x.text == "0") {
                                c.dp_overlap = false;
                              } else {
                                r.Fail(f, "expected true or false");
                              }
                              return;
                            }
                            if (k == "blocks_per_stage") {
                              if (x.kind != Value::Kind::kArray) {
                                r.Fail(f, "expected a list of block counts, e.g. [2, 2]");
                                return;
                              }
                              c.blocks_per_stage.clear();
                              for (const Value& item : x.items) {
                                int b = r.Int32(item, f);
                                if (b < 1) r.Fail(f, "every stage needs >= 1 block");
                                c.blocks_per_stage.push_back(b);
                              }
                              return;
                            }
                            int n = r.Int32(x, f);
                            if (n < 0) r.Fail(f, "expected >= 0, got " + std::to_string(n));
                            if (k == "data") c.parallel_data = n;
                            if (k == "tensor") c.parallel_tensor = n;
                            if (k == "pipeline") c.parallel_pipeline = n;
                            if (k == "micro_batch") c.micro_batch = n;
                          });
              } else if (key == "checkpoint") {
                r.ForEach(v, field, {"every_steps", "dir", "keep"},
                          [&](const std::string& k, const Value& x, const std::string& f) {
                            if (x.kind == Value::Kind::kNull) return;
                            if (k == "every_steps") c.checkpoint_every = r.Int(x, f);
                            if (k == "dir") c.checkpoint_dir = r.String(x, f);
                            if (k == "keep") c.checkpoint_keep = r.Int(x, f);
                          });
              } else if (key == "restart") {
                r.ForEach(v, field, {"max_restarts", "backoff_seconds"},
                          [&](const std::string& k, const Value& x, const std::string& f) {
                            if (x.kind == Value::Kind::kNull) return;
                            if (k == "max_restarts") c.max_restarts = r.Int32(x, f);
                            if (k == "backoff_seconds") c.backoff_seconds = r.Double(x, f);
                          });
              } else if (key == "env") {
                if (v.kind == Value::Kind::kNull) return;
                if (v.kind != Value::Kind::kObject) {
                  r.Fail(field, std::string("expected an object, got a ") + KindName(v.kind));
                }
                // Environment names are kept verbatim (no snake_case folding).
                for (const auto& [name, val] : v.members) {
                  c.env[name] = r.String(val, field + "." + name);
                }
              }
            });

  // Model: a preset (explicit dimensions override single fields) or all five dimensions.
  const std::string f = source + ": ";
  if (!c.preset.empty()) {
    std::optional<ModelDims> preset = PresetDims(c.preset);
    if (!preset) {
      r.Fail("model.preset",
             "unknown preset \"" + c.preset + "\" (expected one of: " + PresetNames() + ")");
    }
    c.model = *preset;
    if (explicit_dims.layers) c.model.layers = explicit_dims.layers;
    if (explicit_dims.channels) c.model.channels = explicit_dims.channels;
    if (explicit_dims.heads) c.model.heads = explicit_dims.heads;
    if (explicit_dims.max_seq_len) c.model.max_seq_len = explicit_dims.max_seq_len;
    if (explicit_dims.vocab) c.model.vocab = explicit_dims.vocab;
  } else {
    if (explicit_dims == ModelDims{}) {
      r.Fail("model",
             "expected a preset or the dimensions layers, hidden, heads, seq_len, "
             "vocab");
    }
    c.model = explicit_dims;
  }
  if (std::string problem = DimsProblem(c.model); !problem.empty()) throw InputError(f + problem);

  // Data.
  if (c.data_path.empty() == c.data_builtin.empty()) {
    r.Fail("data",
           "expected exactly one of data.path and data.builtin (e.g. builtin: "
           "tiny-corpus)");
  }
  if (!c.data_builtin.empty() && c.data_builtin != "tiny-corpus") {
    r.Fail("data.builtin", "unknown corpus \"" + c.data_builtin + "\" (expected tiny-corpus)");
  }

  // Training.
  if (c.steps <= 0) r.Fail("train.steps", "expected > 0, got " + std::to_string(c.steps));
  if (c.seq_len == 0) c.seq_len = c.model.max_seq_len;
  if (c.seq_len < 0 || c.seq_len > c.model.max_seq_len) {
    r.Fail("train.seq_len", "expected 1.." + std::to_string(c.model.max_seq_len) +
                                " (model.seq_len, the position table), got " +
                                std::to_string(c.seq_len));
  }
  if (c.global_batch_tokens < 0) {
    r.Fail("train.global_batch_tokens",
           "expected > 0, got " + std::to_string(c.global_batch_tokens));
  }
  if (c.global_batch_tokens == 0) {
    c.global_batch_tokens = int64_t{c.seq_len} * (c.micro_batch > 0 ? c.micro_batch : 8);
  }
  if (c.global_batch_tokens % c.seq_len != 0) {
    r.Fail("train.global_batch_tokens", std::to_string(c.global_batch_tokens) +
                                            " is not a multiple of the sequence length " +
                                            std::to_string(c.seq_len));
  }
  if (!(c.lr > 0.0)) r.Fail("train.lr", "expected > 0");
  if (c.precision != "fp32" && c.precision != "bf16") {
    r.Fail("train.precision", "expected fp32 or bf16, got \"" + c.precision + "\"");
  }
  if (!(c.dp_bucket_mb > 0.0 && c.dp_bucket_mb <= 1024.0)) {
    r.Fail("parallelism.dp_bucket_mb",
           "expected a bucket size in MiB in (0, 1024], got " + std::to_string(c.dp_bucket_mb));
  }
  if (c.attention != "auto" && c.attention != "fused" && c.attention != "unfused") {
    r.Fail("train.attention", "expected auto, fused or unfused, got \"" + c.attention + "\"");
  }
  if (c.warmup_steps < 0) r.Fail("train.warmup_steps", "expected >= 0");
  if (c.min_lr_ratio < 0.0 || c.min_lr_ratio > 1.0) {
    r.Fail("train.min_lr_ratio", "expected a value in [0, 1]");
  }
  if (c.weight_decay < 0.0) r.Fail("train.weight_decay", "expected >= 0");
  if (c.grad_clip < 0.0) r.Fail("train.grad_clip", "expected >= 0 (0 disables clipping)");
  if (c.eval_every < 0) r.Fail("train.eval_every", "expected >= 0 (0 disables evaluation)");
  if (c.checkpoint_every < 0) {
    r.Fail("checkpoint.every_steps", "expected >= 0 (0 saves only at the end)");
  }
  if (c.checkpoint_keep < 0) {
    r.Fail("checkpoint.keep", "expected >= 0 (0 keeps every checkpoint)");
  }
  if (c.micro_batch > 0 && (c.global_batch_tokens / c.seq_len) % c.micro_batch != 0) {
    r.Fail("parallelism.micro_batch", std::to_string(c.micro_batch) + " does not divide the " +
                                          std::to_string(c.global_batch_tokens / c.seq_len) +
                                          " sequences of train.global_batch_tokens");
  }

  // Name: at most 63 characters of [a-z0-9-].
  if (c.name.empty() || c.name.size() > 63) r.Fail("name", "expected 1 to 63 characters");
  for (char ch : c.name) {
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-')) {
      r.Fail("name", "expected only [a-z0-9-], got \"" + c.name + "\"");
    }
  }
  return c;
}

Value ParseSpecText(const std::string& text, const std::string& source) {
  bool json = source.size() >= 5 && source.compare(source.size() - 5, 5, ".json") == 0;
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') json = true;
  return json ? ParseJson(text, source) : ParseYaml(text, source);
}

namespace {

// MergeSpecs with key folding switched off below `env`, whose keys are names, not fields.
Value Merge(const Value& base, const Value& top, bool fold) {
  if (base.kind != Value::Kind::kObject || top.kind != Value::Kind::kObject) return top;
  auto norm = [fold](const std::string& key) { return fold ? SnakeCase(key) : key; };
  Value out = base;
  for (auto& [key, value] : out.members) key = norm(key);
  for (const auto& [raw_key, value] : top.members) {
    std::string key = norm(raw_key);
    bool merged = false;
    for (auto& [k, v] : out.members) {
      if (k == key) {
        v = Merge(v, value, fold && key != "env");
        merged = true;
      }
    }
    if (!merged) out.members.emplace_back(key, value);
  }
  return out;
}

}  // namespace

Value MergeSpecs(const Value& base, const Value& top) { return Merge(base, top, true); }

}  // namespace loom::train
