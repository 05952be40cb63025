// The rank environment that loom-worker gives each training process (docs/rank-contract.md),
// and the batch shape of one optimizer step derived from it and the spec.
#ifndef LOOM_WORKER_TRAIN_CONFIG_RANK_ENV_H_
#define LOOM_WORKER_TRAIN_CONFIG_RANK_ENV_H_

#include <cstdint>
#include <functional>
#include <string>

#include "worker/train/config/job_config.h"

namespace loom::train {

// LOOM_LAYOUT: data=D,tensor=T,pipeline=P,micro_batch=M,num_micro_batches=K.
struct Layout {
  int data = 1;
  int tensor = 1;
  int pipeline = 1;
  int micro_batch = 0;
  int num_micro_batches = 0;
};

struct RankEnv {
  std::string job;               // LOOM_JOB, "jobs/{job}"; empty when standalone
  int64_t generation = 1;        // LOOM_JOB_GENERATION
  int rank = 0;                  // LOOM_RANK
  int world_size = 1;            // LOOM_WORLD_SIZE
  int local_rank = 0;            // LOOM_LOCAL_RANK
  std::string device = "cpu:0";  // LOOM_DEVICE
  bool has_layout = false;       // LOOM_LAYOUT was set
  Layout layout;
  std::string spec_file;       // LOOM_SPEC_FILE
  std::string checkpoint_dir;  // LOOM_CHECKPOINT_DIR
  std::string work_dir;        // LOOM_WORK_DIR
  int progress_fd = -1;        // LOOM_PROGRESS_FD; -1 when unset
};

// Reads the LOOM_* variables through `get` (returns nullptr for an unset variable; std::getenv
// in production, a map in tests). A malformed value is an InputError naming the variable.
RankEnv ReadRankEnv(const std::function<const char*(const char*)>& get);

// Parses a LOOM_LAYOUT value. Throws InputError naming LOOM_LAYOUT.
Layout ParseLayout(const std::string& text);

// The shape of one optimizer step on this rank: K micro-batches of B sequences of T tokens.
struct BatchShape {
  int B = 0;        // sequences per micro-batch
  int T = 0;        // tokens per sequence
  int K = 0;        // micro-batches per step (gradient accumulation)
  int dp_size = 1;  // data-parallel ranks
  int dp_rank = 0;  // this rank's index among them: (rank / tensor) % data
  int64_t tokens_per_step() const { return int64_t{B} * T * K * dp_size; }
};

// Resolves the batch shape. Under loom-worker (env.has_layout) the layout decides and must
// satisfy global_batch_tokens = T * data * micro_batch * num_micro_batches and
// data * tensor * pipeline = LOOM_WORLD_SIZE; tensor or pipeline above 1 are refused (not in
// this loom-train yet). Without LOOM_LAYOUT the world must be 1 rank. Standalone, the
// micro-batch is parallelism.micro_batch, or else the largest divisor of the step's sequence
// count that is at most 8. Throws InputError naming LOOM_LAYOUT or the spec field.
BatchShape ResolveBatchShape(const JobConfig& config, const RankEnv& env);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CONFIG_RANK_ENV_H_
