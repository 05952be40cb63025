// The job spec as loom-train uses it: read from YAML (people) or JSON (loom-worker's
// LOOM_SPEC_FILE, protobuf JSON mapping), with defaults applied and every field validated.
//
// Keys are the proto field names (proto/loom/v1/job.proto) in snake_case or lowerCamelCase.
// Integers may be JSON strings (the protobuf JSON mapping writes int64 that way). An unknown key,
// a value of the wrong type or out of range is an InputError naming the file and the field.
//
// Zero as "unset": proto3 cannot tell an absent plain scalar from zero, so where zero is not a
// meaningful value (train.lr, train.global_batch_tokens, train.seq_len, the model's dimensions)
// zero means "use the default". Fields with explicit presence in job.proto (train.seed,
// min_lr_ratio, weight_decay, grad_clip, restart.backoff_seconds) and fields where zero means
// something (warmup_steps, eval_every = never, checkpoint.every_steps = only at the end) take
// zero literally; an absent key always gets the default.
#ifndef LOOM_WORKER_TRAIN_CONFIG_JOB_CONFIG_H_
#define LOOM_WORKER_TRAIN_CONFIG_JOB_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "worker/train/config/json.h"
#include "worker/train/model/dims.h"

namespace loom::train {

struct JobConfig {
  std::string name = "job";

  std::string preset;  // empty when the dimensions were given explicitly
  ModelDims model;

  std::string data_path;     // exactly one of data_path and data_builtin is non-empty
  std::string data_builtin;  // "tiny-corpus"
  std::string val_path;      // empty: the last 10% of the training tokens

  int64_t steps = 0;
  int64_t global_batch_tokens = 0;  // 0: seq_len * micro_batch if given, else seq_len * 8
  double lr = 6e-4;
  // The GPU path's attention kernels: "auto", "fused" or "unfused" (TrainSpec.attention).
  std::string attention = "auto";
  std::string precision = "fp32";  // "fp32" or "bf16" (the CPU backend computes in fp32)
  uint64_t seed = 1337;
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.1;
  double weight_decay = 0.1;
  double grad_clip = 1.0;
  int64_t eval_every = 0;
  int seq_len = 0;  // training sequence length T; defaults to model.max_seq_len

  int gpus = 0;
  int cpu_devices = 0;

  bool parallelism_auto = false;
  int parallel_data = 0;
  int parallel_tensor = 0;
  int parallel_pipeline = 0;
  int micro_batch = 0;   // 0: chosen by loom-train (standalone) or LOOM_LAYOUT (under the worker)
  std::string schedule;  // "", "1f1b" or "gpipe" (LOOM_LAYOUT decides under the worker)
  bool zero1 = false;    // likewise
  std::vector<int> blocks_per_stage;  // likewise; empty: an even split
  double dp_bucket_mb = 25.0;         // data-parallel gradient bucket size, MiB (ParallelismSpec)
  bool dp_overlap = true;             // all-reduce buckets while backward runs (ParallelismSpec)

  int64_t checkpoint_every = 0;
  std::string checkpoint_dir;
  // checkpoint.keep: complete checkpoints kept, newest first (0 keeps all; see retention.h).
  int64_t checkpoint_keep = 3;

  int max_restarts = 0;
  double backoff_seconds = 1.0;
  int priority = 0;
  std::map<std::string, std::string> env;
};

// Reads a spec document (already parsed) into a JobConfig and validates it. `source` names the
// document in errors ("job.yaml: train.steps: expected > 0, got 0"). Throws InputError.
JobConfig JobConfigFromValue(const Value& spec, const std::string& source);

// Parses `text` as YAML, or as JSON when `source` ends in ".json" or the text starts with '{'.
Value ParseSpecText(const std::string& text, const std::string& source);

// Overlays `top` onto `base`: objects merge member by member (after normalising keys to
// snake_case), anything else in `top` replaces the value in `base`. Used for flags over a spec.
Value MergeSpecs(const Value& base, const Value& top);

// "globalBatchTokens" -> "global_batch_tokens"; snake_case passes unchanged.
std::string SnakeCase(const std::string& key);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CONFIG_JOB_CONFIG_H_
