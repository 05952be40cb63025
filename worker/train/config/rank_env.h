// The rank environment that loom-worker gives each training process (docs/rank-contract.md),
// and the batch shape of one optimizer step derived from it and the spec.
#ifndef LOOM_WORKER_TRAIN_CONFIG_RANK_ENV_H_
#define LOOM_WORKER_TRAIN_CONFIG_RANK_ENV_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "worker/train/config/job_config.h"

namespace loom::train {

// LOOM_LAYOUT: data=D,tensor=T,pipeline=P,micro_batch=M,num_micro_batches=K, and optionally
// blocks=B0/B1/...(blocks per pipeline stage), schedule=1f1b|gpipe, zero1=0|1.
struct Layout {
  int data = 1;
  int tensor = 1;
  int pipeline = 1;
  int micro_batch = 0;
  int num_micro_batches = 0;
  std::vector<int> blocks_per_stage;  // empty: an even split (ResolveBatchShape)
  std::string schedule = "1f1b";      // "1f1b" or "gpipe"
  bool zero1 = false;                 // optimizer state sharded over the data-parallel ranks
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

// The shape of one optimizer step on this rank: K micro-batches of B sequences of T tokens, and
// the rank's place in the layout. Rank order puts tensor fastest, then data, then pipeline:
// rank = tp_rank + tp_size * (dp_rank + dp_size * pp_rank).
struct BatchShape {
  int B = 0;        // sequences per micro-batch
  int T = 0;        // tokens per sequence
  int K = 0;        // micro-batches per step per data-parallel rank (gradient accumulation)
  int dp_size = 1;  // data-parallel ranks
  int dp_rank = 0;  // this rank's index among them: (rank / tensor) % data
  int tp_size = 1;  // tensor-parallel ranks
  int tp_rank = 0;  // rank % tensor
  int pp_size = 1;  // pipeline stages
  int pp_rank = 0;  // this rank's stage: rank / (tensor * data)
  // Stage s runs blocks [stage_bounds[s], stage_bounds[s + 1]); pp_size + 1 entries, from 0 to
  // the model's layers, strictly increasing.
  std::vector<int> stage_bounds;
  std::string schedule = "1f1b";  // "1f1b" or "gpipe"
  bool zero1 = false;
  int64_t tokens_per_step() const { return int64_t{B} * T * K * dp_size; }
  int first_block() const { return stage_bounds[pp_rank]; }
  int last_block() const { return stage_bounds[pp_rank + 1]; }
};

// The even split of `layers` blocks over `stages` stages: the first layers % stages stages get
// one block more. Requires 1 <= stages <= layers.
std::vector<int> EvenBlocksPerStage(int layers, int stages);

// Resolves the batch shape. Under loom-worker (env.has_layout) the layout decides and must
// satisfy global_batch_tokens = T * data * micro_batch * num_micro_batches,
// data * tensor * pipeline = LOOM_WORLD_SIZE, tensor dividing the heads and the MLP width,
// pipeline <= layers, and blocks (when given) one positive count per stage summing to the
// layers. Without LOOM_LAYOUT the world must be 1 rank. Standalone, the micro-batch is
// parallelism.micro_batch, or else the largest divisor of the step's sequence count that is at
// most 8. Throws InputError naming LOOM_LAYOUT or the spec field, with the fix.
BatchShape ResolveBatchShape(const JobConfig& config, const RankEnv& env);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CONFIG_RANK_ENV_H_
