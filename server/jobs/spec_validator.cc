#include "server/jobs/spec_validator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/echo.h"
#include "common/env_policy.h"
#include "common/spec_path.h"
#include "common/status_macros.h"
#include "server/jobs/model_presets.h"

namespace loom::jobs {
namespace {

// Defaults, as documented on the fields of proto/loom/v1/job.proto.
constexpr char kDefaultName[] = "job";
constexpr double kDefaultLr = 6e-4;
constexpr int64_t kDefaultSeed = 1337;
constexpr double kDefaultMinLrRatio = 0.1;
constexpr double kDefaultWeightDecay = 0.1;
constexpr double kDefaultGradClip = 1.0;
constexpr double kDefaultBackoffSeconds = 1.0;
constexpr double kMaxBucketMb = 1024;  // spec.parallelism.dp_bucket_mb
// Sequences per data-parallel rank per step when global_batch_tokens is not
// given.
constexpr int64_t kDefaultSequencesPerRank = 8;
// The default micro-batch is the largest divisor of the per-rank sequences up
// to this.
constexpr int kMaxDefaultMicroBatch = 8;

constexpr char kBuiltinCorpus[] = "tiny-corpus";

// Limits: beyond these a spec is certainly a mistake, and they keep every
// product below in int64 range (and the layout's int32 fields meaningful).
constexpr int kMaxNameLength = 63;
constexpr int kMaxLayers = 1024;
constexpr int kMaxHidden = 1 << 16;
constexpr int kMaxSeqLen = 1 << 20;
constexpr int kMaxVocab = 1 << 24;
constexpr int64_t kMaxSequencesPerRank = 1 << 20;
constexpr int kMaxPriority = 1000;
constexpr int kMaxRestarts = 100;
constexpr double kMaxBackoffSeconds = 3600;
// Counts (steps, batch tokens, intervals) travel as JSON numbers on the rank's progress lines and
// in spec.json, which readers hold as doubles: beyond 2^53 they would no longer be exact, so the
// worker would drop every progress line. Refused here instead.
constexpr int64_t kMaxCount = int64_t{1} << 53;

// This Abseil's StrCat takes absl::string_view, which is not std::string_view.
std::string S(std::string_view v) { return std::string(v); }

absl::Status Invalid(std::string_view field, std::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(S(field), ": ", S(message)));
}

absl::Status Precondition(std::string_view field, std::string_view message) {
  return absl::FailedPreconditionError(absl::StrCat(S(field), ": ", S(message)));
}

bool IsValidName(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
}

// Divisors of n (n >= 1), ascending; at most `max_count` of them (the
// smallest).
std::vector<int64_t> Divisors(int64_t n, size_t max_count = 12) {
  std::vector<int64_t> low, high;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    low.push_back(d);
    if (d != n / d) high.push_back(n / d);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  if (low.size() > max_count) low.resize(max_count);
  return low;
}

std::string DivisorList(int64_t n) { return absl::StrJoin(Divisors(n), ", "); }

// Echoed user input is truncated (common/echo.h).
std::string Quoted(std::string_view s) { return Echo(absl::string_view(s.data(), s.size())); }

absl::Status CheckName(v1::JobSpec &spec) {
  if (spec.name().empty()) {
    spec.set_name(kDefaultName);
    return absl::OkStatus();
  }
  if (!IsValidName(spec.name())) {
    return Invalid("spec.name", absl::StrCat(Quoted(spec.name()),
                                             " must be 1 to 63 characters of a-z, 0-9 and '-', "
                                             "e.g. \"gpt2-small-demo\""));
  }
  return absl::OkStatus();
}

// Sets the device kind and count.
absl::Status CheckResources(const v1::ResourceSpec &resources, ValidatedSpec &out) {
  if (resources.gpus() < 0) {
    return Invalid("spec.resources.gpus",
                   absl::StrCat(resources.gpus(), " must be > 0 (the number of GPUs)"));
  }
  if (resources.cpu_devices() < 0) {
    return Invalid(
        "spec.resources.cpu_devices",
        absl::StrCat(resources.cpu_devices(), " must be > 0 (the number of CPU devices)"));
  }
  if (resources.gpus() > 0 && resources.cpu_devices() > 0) {
    return Invalid("spec.resources",
                   absl::StrCat("asks for both gpus (", resources.gpus(), ") and cpu_devices (",
                                resources.cpu_devices(), "); give exactly one of the two"));
  }
  if (resources.gpus() == 0 && resources.cpu_devices() == 0) {
    return Invalid("spec.resources",
                   "no devices requested; set spec.resources.gpus or "
                   "spec.resources.cpu_devices "
                   "to a number > 0");
  }
  out.device_kind = resources.gpus() > 0 ? v1::DEVICE_KIND_GPU : v1::DEVICE_KIND_CPU;
  out.devices = resources.gpus() > 0 ? resources.gpus() : resources.cpu_devices();
  return absl::OkStatus();
}

struct DimField {
  const char *field;
  int ModelDims::*dim;
  int (v1::ModelSpec::*get)() const;
  void (v1::ModelSpec::*set)(int32_t);
  int max;
};
constexpr DimField kDimFields[] = {
    {"layers", &ModelDims::layers, &v1::ModelSpec::layers, &v1::ModelSpec::set_layers, kMaxLayers},
    {"hidden", &ModelDims::hidden, &v1::ModelSpec::hidden, &v1::ModelSpec::set_hidden, kMaxHidden},
    {"heads", &ModelDims::heads, &v1::ModelSpec::heads, &v1::ModelSpec::set_heads, kMaxHidden},
    {"seq_len", &ModelDims::seq_len, &v1::ModelSpec::seq_len, &v1::ModelSpec::set_seq_len,
     kMaxSeqLen},
    {"vocab", &ModelDims::vocab, &v1::ModelSpec::vocab, &v1::ModelSpec::set_vocab, kMaxVocab},
};

// Fills all five dimensions (a preset's name is kept beside them).
absl::Status CheckModel(v1::ModelSpec &model) {
  if (!model.preset().empty()) {
    const std::optional<ModelDims> preset = FindModelPreset(model.preset());
    if (!preset.has_value()) {
      return Invalid("spec.model.preset", absl::StrCat("unknown preset ", Quoted(model.preset()),
                                                       "; use one of: ", ModelPresetNames()));
    }
    // Dimensions beside a preset are allowed only when they agree with it,
    // which keeps a validated spec (preset plus its filled dimensions) valid.
    for (const DimField &f : kDimFields) {
      const int given = (model.*f.get)();
      const int expected = (*preset).*f.dim;
      if (given != 0 && given != expected) {
        return Invalid(
            absl::StrCat("spec.model.", f.field),
            absl::StrCat(given, " conflicts with preset ", model.preset(), " (", f.field, " ",
                         expected, "); drop the preset or the explicit dimensions"));
      }
      (model.*f.set)(expected);
    }
    return absl::OkStatus();
  }
  const bool any = std::any_of(std::begin(kDimFields), std::end(kDimFields),
                               [&](const DimField &f) { return (model.*f.get)() != 0; });
  if (!any) {
    return Invalid("spec.model",
                   absl::StrCat("no model; set spec.model.preset (one of: ", ModelPresetNames(),
                                ") or all five of layers, hidden, heads, seq_len, "
                                "vocab"));
  }
  for (const DimField &f : kDimFields) {
    const int value = (model.*f.get)();
    if (value <= 0 || value > f.max) {
      return Invalid(absl::StrCat("spec.model.", f.field),
                     absl::StrCat(value, " must be within [1, ", f.max,
                                  "]; explicit dimensions need all five of layers, hidden, "
                                  "heads, seq_len and vocab"));
    }
  }
  if (model.hidden() % model.heads() != 0) {
    return Invalid(
        "spec.model.heads",
        absl::StrCat(model.heads(), " does not divide spec.model.hidden (", model.hidden(),
                     "); use heads that divide hidden, e.g. ", DivisorList(model.hidden())));
  }
  return absl::OkStatus();
}

// Shape only (the roots are checked later): loomd never opens a user's file (the worker checks that
// it exists, on the node that reads it). Normalises the paths in place.
absl::Status CheckData(v1::DataSpec &data) {
  if (!data.path().empty() && !data.builtin().empty()) {
    return Invalid("spec.data", "give either spec.data.path or spec.data.builtin, not both");
  }
  if (data.path().empty() && data.builtin().empty()) {
    return Invalid("spec.data", absl::StrCat("no training data; set spec.data.path to a token "
                                             "file or spec.data.builtin to ",
                                             kBuiltinCorpus));
  }
  if (!data.builtin().empty() && data.builtin() != kBuiltinCorpus) {
    return Invalid("spec.data.builtin",
                   absl::StrCat("unknown corpus ", Quoted(data.builtin()),
                                "; the only builtin corpus is ", kBuiltinCorpus));
  }
  const std::pair<const char *, std::string *> paths[] = {
      {"spec.data.path", data.mutable_path()}, {"spec.data.val_path", data.mutable_val_path()}};
  for (const auto &[field, path] : paths) {
    if (path->empty()) continue;
    ASSIGN_OR_RETURN(*path, NormalizeSpecPath(*path, field));
  }
  return absl::OkStatus();
}

// The operator's roots (FAILED_PRECONDITION), for the paths CheckData and
// CheckCheckpointAndRestart normalised.
absl::Status CheckRoots(const v1::JobSpec &spec, const SpecPolicy &policy) {
  const std::pair<const char *, const std::string *> data[] = {
      {"spec.data.path", &spec.data().path()}, {"spec.data.val_path", &spec.data().val_path()}};
  for (const auto &[field, path] : data) {
    if (path->empty()) continue;
    RETURN_IF_ERROR(CheckUnderRoots(*path, policy.data_roots, field, "loomd --data-roots"));
  }
  if (spec.checkpoint().dir().empty()) return absl::OkStatus();
  return CheckUnderRoots(spec.checkpoint().dir(), policy.checkpoint_roots, "spec.checkpoint.dir",
                         "loomd --checkpoint-roots");
}

// Counts must be exact as JSON numbers (see kMaxCount).
absl::Status CheckCount(std::string_view field, int64_t value) {
  if (value > kMaxCount) {
    return Invalid(field, absl::StrCat(value, " is above 2^53 (", kMaxCount,
                                       "), beyond what progress reports can count exactly"));
  }
  return absl::OkStatus();
}

absl::Status CheckNonNegative(std::string_view field, int64_t value) {
  if (value < 0) return Invalid(field, absl::StrCat(value, " must be >= 0"));
  return absl::OkStatus();
}

// An optional double field: absent fills `fallback`, present requires [low,
// high] (so an explicit 0, e.g. grad_clip: 0 to disable clipping, is kept).
absl::Status CheckDouble(std::string_view field, bool present, double value, double low,
                         double high, double fallback, double *out) {
  if (!present) {
    *out = fallback;
    return absl::OkStatus();
  }
  if (!std::isfinite(value) || value < low || value > high) {
    const std::string range = high == std::numeric_limits<double>::max()
                                  ? absl::StrCat(">= ", low)
                                  : absl::StrCat("within [", low, ", ", high, "]");
    return Invalid(field, absl::StrCat(value, " must be a finite number ", range));
  }
  *out = value;
  return absl::OkStatus();
}

// Everything of `train` but global_batch_tokens, which depends on the layout.
absl::Status CheckTrain(v1::TrainSpec &train, const v1::ModelSpec &model, v1::DeviceKind kind) {
  if (train.steps() <= 0) {
    return Invalid("spec.train.steps",
                   absl::StrCat(train.steps(), " must be > 0 (the number of optimizer steps)"));
  }
  RETURN_IF_ERROR(CheckCount("spec.train.steps", train.steps()));
  RETURN_IF_ERROR(CheckCount("spec.train.warmup_steps", train.warmup_steps()));
  RETURN_IF_ERROR(CheckCount("spec.train.eval_every", train.eval_every()));
  RETURN_IF_ERROR(CheckCount("spec.train.global_batch_tokens", train.global_batch_tokens()));
  double value = 0;
  const double kHuge = std::numeric_limits<double>::max();
  // lr has explicit presence: absent means the default, an explicit 0 is refused (a run
  // that cannot learn is a mistake, not a request for the default).
  if (!train.has_lr()) {
    train.set_lr(kDefaultLr);
  } else if (!std::isfinite(train.lr()) || train.lr() <= 0) {
    return Invalid("spec.train.lr",
                   absl::StrCat(train.lr(),
                                " must be a finite number > 0, e.g. 6e-4; leave it out for the "
                                "default 6e-4"));
  }
  if (train.precision().empty()) {
    train.set_precision(kind == v1::DEVICE_KIND_GPU ? "bf16" : "fp32");
  } else if (train.precision() != "fp32" && train.precision() != "bf16") {
    return Invalid("spec.train.precision", absl::StrCat(Quoted(train.precision()),
                                                        " is not a precision; use fp32 or bf16"));
  } else if (train.precision() == "bf16" && kind != v1::DEVICE_KIND_GPU) {
    return Invalid("spec.train.precision",
                   "bf16 needs GPUs; use fp32 with spec.resources.cpu_devices");
  }
  if (!train.attention().empty() && train.attention() != "auto" && train.attention() != "fused" &&
      train.attention() != "unfused") {
    return Invalid("spec.train.attention",
                   absl::StrCat(Quoted(train.attention()),
                                " is not an attention path; use auto (the default), fused or "
                                "unfused"));
  }
  if (!train.has_seed()) train.set_seed(kDefaultSeed);
  RETURN_IF_ERROR(CheckNonNegative("spec.train.warmup_steps", train.warmup_steps()));
  RETURN_IF_ERROR(CheckDouble("spec.train.min_lr_ratio", train.has_min_lr_ratio(),
                              train.min_lr_ratio(), 0, 1, kDefaultMinLrRatio, &value));
  train.set_min_lr_ratio(value);
  RETURN_IF_ERROR(CheckDouble("spec.train.weight_decay", train.has_weight_decay(),
                              train.weight_decay(), 0, kHuge, kDefaultWeightDecay, &value));
  train.set_weight_decay(value);
  RETURN_IF_ERROR(CheckDouble("spec.train.grad_clip", train.has_grad_clip(), train.grad_clip(), 0,
                              kHuge, kDefaultGradClip, &value));
  train.set_grad_clip(value);
  RETURN_IF_ERROR(CheckNonNegative("spec.train.eval_every", train.eval_every()));
  if (train.seq_len() == 0) {
    train.set_seq_len(model.seq_len());
  } else if (train.seq_len() < 0 || train.seq_len() > model.seq_len()) {
    return Invalid("spec.train.seq_len",
                   absl::StrCat(train.seq_len(), " must be within [1, ", model.seq_len(),
                                "] (the model's seq_len); leave it out to use ", model.seq_len()));
  }
  return CheckNonNegative("spec.train.global_batch_tokens", train.global_batch_tokens());
}

// Resolves data × tensor × pipeline (filling explicit sizes into
// `parallelism`).
absl::Status CheckParallelism(v1::ParallelismSpec &parallelism, const v1::ModelSpec &model,
                              const ValidatedSpec &out, v1::Layout &layout) {
  const std::pair<const char *, int> sizes[] = {
      {"spec.parallelism.data", parallelism.data()},
      {"spec.parallelism.tensor", parallelism.tensor()},
      {"spec.parallelism.pipeline", parallelism.pipeline()},
      {"spec.parallelism.micro_batch", parallelism.micro_batch()}};
  for (const auto &[field, value] : sizes) {
    if (value < 0) return Invalid(field, absl::StrCat(value, " must be > 0"));
  }
  const std::string devices_field =
      out.device_kind == v1::DEVICE_KIND_GPU ? "spec.resources.gpus" : "spec.resources.cpu_devices";
  const bool explicit_sizes =
      parallelism.data() > 0 || parallelism.tensor() > 0 || parallelism.pipeline() > 0;
  if (explicit_sizes && parallelism.has_auto_()) {
    return Invalid("spec.parallelism",
                   "give either auto or explicit data/tensor/pipeline sizes, not both");
  }
  int64_t data = out.devices, tensor = 1, pipeline = 1;
  if (explicit_sizes) {
    tensor = parallelism.tensor() > 0 ? parallelism.tensor() : 1;
    pipeline = parallelism.pipeline() > 0 ? parallelism.pipeline() : 1;
    if (parallelism.data() > 0) {
      data = parallelism.data();
      if (data * tensor * pipeline != out.devices) {
        return Invalid(
            "spec.parallelism",
            absl::StrCat("data × tensor × pipeline = ", data, " × ", tensor, " × ", pipeline, " = ",
                         data * tensor * pipeline, " but ", devices_field, " is ", out.devices,
                         "; make the product equal the device count"));
      }
    } else if (out.devices % (tensor * pipeline) != 0) {
      return Invalid("spec.parallelism",
                     absl::StrCat("tensor × pipeline = ", tensor * pipeline, " does not divide ",
                                  devices_field, " (", out.devices,
                                  "); choose sizes whose product divides the device count"));
    } else {
      data = out.devices / (tensor * pipeline);  // the data size follows from the others
    }
  }
  // With `auto` (or nothing) the layout is plain data parallelism: the runtime
  // runs nothing else yet. JobManager::CreateJob then lets the planner choose the
  // micro-batching within it (server/jobs/auto_plan.h); this stays the fallback.
  if (model.heads() % tensor != 0 || (4 * static_cast<int64_t>(model.hidden())) % tensor != 0) {
    return Invalid("spec.parallelism.tensor",
                   absl::StrCat(tensor, " does not divide the model's ", model.heads(),
                                " heads; use one of ", DivisorList(model.heads())));
  }
  if (pipeline > model.layers()) {
    return Invalid("spec.parallelism.pipeline",
                   absl::StrCat(pipeline, " exceeds the model's ", model.layers(),
                                " layers; use at most ", model.layers()));
  }
  if (!parallelism.schedule().empty() && parallelism.schedule() != "1f1b" &&
      parallelism.schedule() != "gpipe") {
    return Invalid("spec.parallelism.schedule",
                   absl::StrCat("\"", parallelism.schedule(),
                                "\" is not a pipeline schedule; use 1f1b or gpipe"));
  }
  if (parallelism.blocks_per_stage_size() > 0) {
    int64_t covered = 0;
    for (int32_t b : parallelism.blocks_per_stage()) {
      if (b < 1) {
        return Invalid("spec.parallelism.blocks_per_stage",
                       absl::StrCat(b, " blocks: every stage needs at least one block"));
      }
      covered += b;
    }
    if (parallelism.blocks_per_stage_size() != pipeline || covered != model.layers()) {
      return Invalid("spec.parallelism.blocks_per_stage",
                     absl::StrCat("[", absl::StrJoin(parallelism.blocks_per_stage(), ", "),
                                  "] must give one count per pipeline stage (", pipeline,
                                  ") summing to the model's ", model.layers(),
                                  " layers, so that the stages cover every block once"));
    }
  }
  if (explicit_sizes) {
    parallelism.set_data(static_cast<int32_t>(data));
    parallelism.set_tensor(static_cast<int32_t>(tensor));
    parallelism.set_pipeline(static_cast<int32_t>(pipeline));
  }
  layout.set_data(static_cast<int32_t>(data));
  layout.set_tensor(static_cast<int32_t>(tensor));
  layout.set_pipeline(static_cast<int32_t>(pipeline));
  layout.set_schedule(parallelism.schedule());
  layout.set_zero1(parallelism.zero1());
  if (parallelism.has_dp_bucket_mb() &&
      !(parallelism.dp_bucket_mb() > 0.0 && parallelism.dp_bucket_mb() <= kMaxBucketMb)) {
    return Invalid("spec.parallelism.dp_bucket_mb",
                   absl::StrCat(parallelism.dp_bucket_mb(),
                                " is not a bucket size; give MiB in (0, 1024] (default 25)"));
  }
  *layout.mutable_blocks_per_stage() = parallelism.blocks_per_stage();
  return absl::OkStatus();
}

// global_batch_tokens = seq_len × data × micro_batch × num_micro_batches: fills
// the defaults and the layout's micro-batching.
absl::Status CheckBatch(v1::TrainSpec &train, v1::ParallelismSpec &parallelism,
                        v1::Layout &layout) {
  const int64_t seq_len = train.seq_len();
  const int64_t unit = seq_len * layout.data();  // tokens of one sequence on every dp rank
  const int64_t micro_batch = parallelism.micro_batch();
  if (train.global_batch_tokens() == 0) {
    // Default: 8 sequences per data-parallel rank, rounded up to a multiple of
    // the micro-batch.
    const int64_t per_rank =
        micro_batch > 0 ? micro_batch * ((kDefaultSequencesPerRank + micro_batch - 1) / micro_batch)
                        : kDefaultSequencesPerRank;
    train.set_global_batch_tokens(unit * per_rank);
  }
  const int64_t tokens = train.global_batch_tokens();
  if (tokens % unit != 0) {
    const int64_t below = tokens / unit * unit;
    return Invalid("spec.train.global_batch_tokens",
                   absl::StrCat(tokens, " is not a multiple of train.seq_len × data = ", seq_len,
                                " × ", layout.data(), " = ", unit, " tokens; use ",
                                below > 0 ? absl::StrCat(below, " or ") : "", below + unit));
  }
  const int64_t per_rank = tokens / unit;
  if (per_rank > kMaxSequencesPerRank) {
    return Invalid("spec.train.global_batch_tokens",
                   absl::StrCat(tokens, " gives ", per_rank,
                                " sequences per data-parallel rank per step; at most ",
                                kMaxSequencesPerRank, " are allowed"));
  }
  int64_t chosen = micro_batch;
  if (chosen == 0) {
    for (chosen = kMaxDefaultMicroBatch; per_rank % chosen != 0; --chosen) {
    }
    parallelism.set_micro_batch(static_cast<int32_t>(chosen));
  } else if (per_rank % chosen != 0) {
    return Invalid("spec.parallelism.micro_batch",
                   absl::StrCat(chosen, " does not divide the ", per_rank,
                                " sequences per data-parallel rank (global_batch_tokens / "
                                "(seq_len × data)); use one of ",
                                DivisorList(per_rank)));
  }
  layout.set_micro_batch(static_cast<int32_t>(chosen));
  layout.set_num_micro_batches(static_cast<int32_t>(per_rank / chosen));
  return absl::OkStatus();
}

// Normalises checkpoint.dir in place. The job's checkpoints go to <dir>/<job id> (the worker
// adds the job's own folder), so jobs sharing a dir never read or overwrite each other's.
absl::Status CheckCheckpointAndRestart(v1::JobSpec &spec) {
  RETURN_IF_ERROR(CheckNonNegative("spec.checkpoint.every_steps", spec.checkpoint().every_steps()));
  RETURN_IF_ERROR(CheckCount("spec.checkpoint.every_steps", spec.checkpoint().every_steps()));
  if (!spec.checkpoint().dir().empty()) {
    std::string &dir = *spec.mutable_checkpoint()->mutable_dir();
    ASSIGN_OR_RETURN(dir, NormalizeSpecPath(dir, "spec.checkpoint.dir"));
  }
  v1::RestartSpec &restart = *spec.mutable_restart();
  if (restart.max_restarts() < 0 || restart.max_restarts() > kMaxRestarts) {
    return Invalid("spec.restart.max_restarts",
                   absl::StrCat(restart.max_restarts(), " must be within [0, ", kMaxRestarts, "]"));
  }
  double backoff = 0;
  RETURN_IF_ERROR(CheckDouble("spec.restart.backoff_seconds", restart.has_backoff_seconds(),
                              restart.backoff_seconds(), 0, kMaxBackoffSeconds,
                              kDefaultBackoffSeconds, &backoff));
  restart.set_backoff_seconds(backoff);
  if (spec.priority() < -kMaxPriority || spec.priority() > kMaxPriority) {
    return Invalid("spec.priority", absl::StrCat(spec.priority(), " must be within [-",
                                                 kMaxPriority, ", ", kMaxPriority, "]"));
  }
  return absl::OkStatus();
}

// The deny-list and limits shared with loom-worker (common/env_policy.h).
absl::Status CheckEnv(const v1::JobSpec &spec) { return CheckSpecEnv(spec.env(), "spec.env"); }

// spec.rebalance.mode: "", "off", "suggest" or "auto"; auto restarts from checkpoints, so it
// needs periodic ones.
absl::Status CheckRebalance(const v1::JobSpec &spec) {
  const std::string &mode = spec.rebalance().mode();
  if (mode != "" && mode != "off" && mode != "suggest" && mode != "auto") {
    return Invalid("spec.rebalance.mode",
                   absl::StrCat("\"", mode.substr(0, 64),
                                "\" is not one of off, suggest, auto"));
  }
  if (mode == "auto" && spec.checkpoint().every_steps() <= 0) {
    return Invalid("spec.rebalance.mode",
                   "auto re-splits by restarting from the last checkpoint: set "
                   "checkpoint.every_steps > 0");
  }
  return absl::OkStatus();
}

absl::Status CheckCapacity(const ValidatedSpec &out, const ClusterCapacity &capacity) {
  const bool gpu = out.device_kind == v1::DEVICE_KIND_GPU;
  const DeviceCapacity &have = gpu ? capacity.gpu : capacity.cpu;
  if (out.devices <= have.total) return absl::OkStatus();
  const char *field = gpu ? "spec.resources.gpus" : "spec.resources.cpu_devices";
  const char *what = gpu ? "GPUs" : "CPU devices";
  const std::string where =
      absl::StrCat(capacity.ready_nodes, " ready node", capacity.ready_nodes == 1 ? "" : "s");
  if (have.total == 0) {
    return Precondition(field, absl::StrCat(out.devices, " requested but the cluster has no ", what,
                                            " on ", where, "; add nodes with ", what,
                                            gpu ? " or ask for cpu_devices instead" : ""));
  }
  return Precondition(
      field, absl::StrCat(out.devices, " requested but the cluster has ", have.total, " ", what,
                          " on ", where, "; ask for at most ", have.total, " or add nodes"));
}

}  // namespace

ClusterCapacity CapacityOf(const std::vector<v1::Node> &nodes) {
  ClusterCapacity capacity;
  for (const v1::Node &node : nodes) {
    if (node.state() != v1::NODE_STATE_READY) continue;
    ++capacity.ready_nodes;
    int gpus = 0, cpus = 0;
    for (const v1::Device &device : node.devices()) {
      if (device.kind() == v1::DEVICE_KIND_GPU) ++gpus;
      if (device.kind() == v1::DEVICE_KIND_CPU) ++cpus;
    }
    capacity.gpu.total += gpus;
    capacity.cpu.total += cpus;
    capacity.gpu.max_per_node = std::max(capacity.gpu.max_per_node, gpus);
    capacity.cpu.max_per_node = std::max(capacity.cpu.max_per_node, cpus);
  }
  return capacity;
}

absl::StatusOr<ValidatedSpec> ValidateJobSpec(const v1::JobSpec &spec,
                                              const ClusterCapacity &capacity,
                                              const SpecPolicy &policy) {
  ValidatedSpec out;
  out.spec = spec;
  v1::JobSpec &s = out.spec;
  // INVALID_ARGUMENT: the spec itself.
  RETURN_IF_ERROR(CheckName(s));
  RETURN_IF_ERROR(CheckResources(s.resources(), out));
  RETURN_IF_ERROR(CheckModel(*s.mutable_model()));
  RETURN_IF_ERROR(CheckData(*s.mutable_data()));
  RETURN_IF_ERROR(CheckTrain(*s.mutable_train(), s.model(), out.device_kind));
  RETURN_IF_ERROR(CheckParallelism(*s.mutable_parallelism(), s.model(), out, out.layout));
  RETURN_IF_ERROR(CheckBatch(*s.mutable_train(), *s.mutable_parallelism(), out.layout));
  RETURN_IF_ERROR(CheckCheckpointAndRestart(s));
  RETURN_IF_ERROR(CheckEnv(s));
  RETURN_IF_ERROR(CheckRebalance(s));
  // FAILED_PRECONDITION: what the operator allows and what the cluster has now.
  RETURN_IF_ERROR(CheckRoots(s, policy));
  RETURN_IF_ERROR(CheckCapacity(out, capacity));
  return out;
}

}  // namespace loom::jobs
