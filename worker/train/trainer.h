// The training loop's core: one optimizer step of a rank under any layout (DESIGN.md, "Layout",
// "DP", "TP", "PP").
//
//   - The rank holds the part of the model its coordinates give (GPT with a ModelShard: its
//     pipeline stage's blocks, its tensor-parallel slice) and runs the stage's pipeline schedule
//     (parallel/pipeline_schedule.h, 1F1B or GPipe) over the step's K micro-batches: a stage
//     that is not the first receives its input activations (B, T, C) from the stage before, one
//     that is not the last sends its output to the next and receives the gradient of that
//     output back; the gradient of the input goes back to the stage before.
//   - Gradients accumulate over the K micro-batches and are averaged over the data-parallel
//     group once per step, in buckets launched during the last micro-batch's backward
//     (parallel/grad_buckets.h); with PP > 1 the first and the last stage then sum the tied
//     embedding's gradient (wte is held by both). Under ZeRO-1 (parallel/zero_optimizer.h) the
//     embedding sum comes first and one reduce-scatter after backward averages each dp rank's
//     range instead.
//   - The loss is computed by the last stage and shared with every rank; the gradient norm sums
//     each tensor once (TensorInfo::owner, on dp rank 0, or under ZeRO-1 each dp rank its range)
//     over the world. Clipping, then AdamW, or under ZeRO-1: each dp rank updates its range and
//     the ranges are all-gathered.
// Deterministic: the same seed, data and batch shape give the same bits on a given machine,
// resumed or not; the same global batch gives the same losses under any layout, up to the
// order of the reductions.
//
// The device side (the model's passes, gradients, optimizer state and the collectives on them)
// is a Backend (backend.h): CpuBackend by default, or one handed in; this loop is the same for
// every backend.
//
// Threading: the training thread only; the communicators run their own threads.
#ifndef LOOM_WORKER_TRAIN_TRAINER_H_
#define LOOM_WORKER_TRAIN_TRAINER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/train/backend.h"
#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/comm/communicator.h"
#include "worker/train/config/job_config.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/data/dataset.h"
#include "worker/train/model/gpt.h"
#include "worker/train/optim/adamw.h"
#include "worker/train/parallel/grad_buckets.h"
#include "worker/train/parallel/pipeline_schedule.h"
#include "worker/train/profiler/block_costs.h"
#include "worker/train/profiler/step_profiler.h"
#include "worker/train/profiler/trace_recorder.h"

namespace loom::train {

// Bytes this rank moved in one step, per collective kind (what it contributed; an all-reduce of
// n floats counts 4n bytes).
struct CommBytes {
  size_t dp_all_reduce = 0;     // gradient buckets over the dp group (ZeRO-1: reduce-scatter)
  size_t tp_all_reduce = 0;     // the model's tensor-parallel all-reduces (from the shapes)
  size_t pp_send_recv = 0;      // activations and gradients sent and received
  size_t emb_all_reduce = 0;    // the tied embedding's gradient between the first and last stage
  size_t all_gather = 0;        // ZeRO-1's parameter all-gather
  size_t world_all_reduce = 0;  // loss, stop flag and the gradient norm's parts
};

struct StepResult {
  int64_t step = 0;            // completed optimizer steps, 1-based (the contract's "step")
  float loss = 0.0f;           // mean training loss over the step's global batch
  double lr = 0.0;             // learning rate used
  double grad_norm = 0.0;      // global gradient norm before clipping
  StepTimes times;             // kCommExposed: waiting on collectives; kBubble: on pipeline peers
  size_t allreduce_bytes = 0;  // bytes this rank all-reduced in the step over dp (0 when dp = 1)
  CommBytes comm;
  // Some rank of the world was asked to stop (TrainerOptions::stop_requested), agreed in this
  // step's world all-reduce: every rank sees the same value at the same step.
  bool stop_requested = false;
  double dp_comm_seconds = 0.0;  // time the dp buckets kept the communication thread busy
  // Derived ratios (0 when not applicable):
  double overlap_ratio = 0.0;    // 1 - wait on the dp buckets / dp_comm_seconds (dp > 1)
  double bubble_ratio = 0.0;     // bubble / step time (pp > 1)
  double idle_ratio = 0.0;       // (comm_exposed + bubble) / step time
  size_t memory_bytes = 0;       // bytes allocated by the training core now
  size_t peak_memory_bytes = 0;  // and at most so far
  size_t rss_bytes = 0;          // resident set size of the process
  // The profiler's allocator statistics (DESIGN.md, "Profiler"). On a GPU: bytes of device
  // memory the caching allocator holds (handed out + cached free blocks) plus the fixed buffers
  // outside it, so reserved >= memory_bytes. The CPU trainer has no cache: its reserved bytes
  // are its allocated bytes.
  size_t reserved_memory_bytes = 0;
  // 1 - largest free cached block / free cached bytes, in [0, 1]: 0 when the cached free memory
  // is one block (or there is none, as always on the CPU); near 1 when it is scattered in pieces
  // too small for a large request.
  double memory_fragmentation = 0.0;
  // Device memory segments (cudaMalloc) the allocator took since the previous step (the first
  // step reported by a process also counts those taken while the trainer was built). The
  // steady-state step allocates none, so anything but 0 after the first steps means the step's
  // memory pattern keeps changing. Always 0 on the CPU.
  uint64_t device_allocations = 0;
  // Where the step ran: "cpu", or "cuda:N" for CUDA device N.
  std::string device = "cpu";
  // Set on sampled steps (every kBlockSampleEvery-th, profiler/block_costs.h): the per-block
  // forward and backward seconds of this rank's stage.
  bool has_block_costs = false;
  BlockCosts block_costs;
};

// The groups a trainer uses (not owned; they outlive the trainer). nullptr = a group of one.
// Sizes and ranks must match the batch shape (checked).
struct TrainerComms {
  Communicator* world = nullptr;
  Communicator* dp = nullptr;
  Communicator* tp = nullptr;
  Communicator* pp = nullptr;
  Communicator* emb = nullptr;  // stage 0 and PP-1 of this (dp, tp), when PP > 1
  // The pipeline's gradient messages, when they need a communicator of their own
  // (ProcessGroups::pp_grad); nullptr: pp carries them.
  Communicator* pp_grad = nullptr;
};

struct TrainerOptions {
  size_t bucket_bytes = kDefaultBucketBytes;  // dp gradient bucket size
  // Launch the dp buckets during backward (true) or all after it (false; for the benchmark).
  bool dp_overlap = true;
  // Read once at the end of each step (diag/stop_request.h): whether this rank was asked to stop.
  // Its OR over the world is StepResult::stop_requested. Unset: never.
  std::function<bool()> stop_requested;
  // Test role only (TEST_ONLY_LOOM_SLOW_RANK, run.cc): milliseconds this rank sleeps at the
  // start of each micro-batch's forward, to make it a straggler for the doctor's tests.
  int test_forward_sleep_ms = 0;
  // The rank's timeline (profiler/trace_recorder.h; not owned, outlives the trainer): every
  // step's phases, per micro-batch, and each collective become records. nullptr: none.
  TraceRecorder* trace = nullptr;
};

class CpuBackend;

class Trainer {
 public:
  // Builds this rank's part of the model on the CPU (CpuBackend: GPT-2 initialisation from
  // config.seed, every shard starting from its slice of the single-rank model) and the
  // optimizer. `data` must outlive the trainer. A shape with empty stage_bounds is one stage
  // holding every block.
  Trainer(const JobConfig& config, const BatchShape& shape, const Dataset& data,
          const TrainerComms& comms, const TrainerOptions& options = {});
  // The same on another backend, built for this shape's shard (stage bounds resolved as
  // above) and groups by the caller, initialised from config.seed. The trainer owns it.
  Trainer(const JobConfig& config, const BatchShape& shape, const Dataset& data,
          const TrainerComms& comms, const TrainerOptions& options,
          std::unique_ptr<Backend> backend);
  // Data parallel only: `dp` is both the world and the dp group (nullptr trains alone).
  Trainer(const JobConfig& config, const BatchShape& shape, const Dataset& data,
          Communicator* dp = nullptr, size_t bucket_bytes = kDefaultBucketBytes);

  // Runs one optimizer step (every rank of the world together). Steps whose number (1-based)
  // is a multiple of block_sample_every() also time each block (StepResult::block_costs). Throws
  // InputError when the loss is not finite (diverged), CommError when a collective failed.
  StepResult Step();

  // Mean loss over the fixed validation batches (at most kMaxEvalBatches micro-batches), run
  // through the pipeline forward only; the same on every rank. Every rank must call it.
  float Evaluate();

  // Saves a checkpoint of the current state under `root` and returns its directory. Every rank
  // must call it: dp rank 0 of each (pp, tp) writes its shard (under ZeRO-1 after gathering
  // the moments over dp), the world meets at a barrier, world rank 0 commits, and the world
  // meets again so the checkpoint exists on return.
  std::string Save(const std::string& root, int64_t generation);

  // Continues from the checkpoint in `dir`, written under any layout: this rank's boxes of the
  // parameters and moments (its ZeRO-1 range of them) and the step. Returns its metadata.
  CheckpointMeta Resume(const std::string& dir);

  int64_t step() const { return step_; }
  Backend& backend() { return *backend_; }
  const Backend& backend() const { return *backend_; }
  // The CPU model, for what only the CPU does (llm.c import and export, tests). Requires the
  // CPU backend (LOOM_CHECK).
  GPT& model();
  const GPT& model() const;
  const BatchShape& shape() const { return shape_; }
  // 0 turns the per-block sampling off (the benchmark's baseline); default kBlockSampleEvery.
  void set_block_sample_every(int64_t every) { block_sample_every_ = every; }
  int64_t block_sample_every() const { return block_sample_every_; }
  size_t num_buckets() const;
  size_t bytes_allocated() const;

  static constexpr int kMaxEvalBatches = 32;

 private:
  bool first_stage() const { return shape_.pp_rank == 0; }
  bool last_stage() const { return shape_.pp_rank == shape_.pp_size - 1; }
  // Runs the schedule's ops of one step; returns the sum of the K micro-batches' losses (on the
  // last stage; 0 elsewhere).
  double RunSchedule(CommBytes* bytes);
  // Waits for every pending pipeline send.
  void WaitSends();
  // Timeline helpers (options_.trace): the steady instant now (0 without a recorder), and a
  // record of `kind` from `start` to now.
  int64_t TraceStart() const { return options_.trace ? TraceRecorder::Now() : 0; }
  void Trace(TraceKind kind, int64_t start, int32_t micro = -1, uint64_t bytes = 0,
             int32_t aux = -1) {
    if (options_.trace) options_.trace->Since(kind, start, micro, bytes, aux);
  }
  bool zero1() const;  // ZeRO-1 over more than one dp rank
  // What the trainer itself holds: the dataset's copy and the token buffers.
  size_t TrainerBytes() const;
  CpuBackend* cpu();  // the backend as the CPU's, or nullptr
  // Where the pipeline's gradient messages go (TrainerComms::pp_grad, else pp).
  Communicator* grad_comm() const { return comms_.pp_grad ? comms_.pp_grad : comms_.pp; }

  JobConfig config_;
  BatchShape shape_;
  const Dataset& data_;
  TrainerComms comms_;
  TrainerOptions options_;
  std::unique_ptr<Backend> backend_;
  LrSchedule schedule_;
  BatchSampler sampler_;
  EvalBatches eval_batches_;
  std::vector<PipeOp> ops_;                   // this stage's schedule
  int slots_ = 1;                             // activation slots the schedule needs
  std::vector<std::vector<int>> inputs_;      // per slot (B, T)
  std::vector<std::vector<int>> targets_;     // per slot (B, T)
  // Stage buffers (backend.h), owned by the backend:
  std::vector<void*> act_in_;           // per slot (B, T, C): received activations
  std::vector<void*> grad_in_;          // per slot (B, T, C): received d(output)
  std::vector<void*> act_out_;          // per slot (B, T, C): activations being sent
  std::vector<void*> grad_out_;         // per slot (B, T, C): d(input) being sent
  std::vector<WorkHandle> act_sends_;   // per slot, the pending send of act_out_
  std::vector<WorkHandle> grad_sends_;  // per slot, the pending send of grad_out_
  int64_t step_ = 0;  // completed optimizer steps
  int64_t block_sample_every_ = kBlockSampleEvery;
  BlockCosts block_costs_;  // filled by the model on sampled steps
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_TRAINER_H_
