// Checkpoints: one directory per saved step, <root>/step-000100/, holding
//   model-<shard>.safetensors      the parameters one shard saved: each tensor it owns under its
//                                  global name (ParamTable), with its local shape; the box of the
//                                  global tensor it is, in __metadata__ as "box.<name>"
//   optimizer-<shard>.safetensors  AdamW's moments of the same boxes, "m.<name>" and "v.<name>"
//   manifest.json                  step, data position, RNG state, layout, generation, shards,
//                                  and every file with its size
// A shard named "" uses the single-file names model.safetensors and optimizer.safetensors; that
// is what single-rank saves write, and what the first format (no boxes: whole tensors) had.
//
// The protocol, with any number of writing processes:
//   1. every writing rank: dir = StageCheckpoint(root, step, generation)  (idempotent)
//   2. every writing rank: WriteShard(dir, its shard name, its table, its buffers)
//   3. barrier
//   4. one rank: CommitCheckpoint(root, dir, meta)  checks that the shards cover every element
//      of every tensor exactly once, writes the manifest last and renames the directory into
//      place. A directory without a manifest is not a checkpoint, so a crash anywhere before
//      the rename leaves every existing checkpoint as it was and publishes nothing.
// Loading (LoadShardedCheckpoint) fills each tensor a rank holds from the intersecting boxes of
// all shards, whatever the layout that wrote them: a checkpoint written under one layout loads
// under any other (DESIGN.md, "the invariance principle").
//
// Stale staging: the staging directory's name carries the generation
// (<root>/step-000100.gen-3.partial), so a crashed earlier run of the same step, which has an
// older generation, cannot mix its files into this run's; CommitCheckpoint removes the staging
// directories of older generations. Within one generation (a rerun of a standalone job) this
// run's WriteShard replaces a stale shard of the same name whole (a kind of file it does not
// write is removed), and CommitCheckpoint drops the files of other shard names when
// meta.shards lists the expected shards (the trainer always does).
//
// ZeRO-1: LoadShardedCheckpoint fills a dp rank's moment range directly (MomentRange); saving
// either gathers the moments onto dp rank 0, or lets every dp rank write its range under its
// own shard name (WriteShard with a MomentRange; params from dp rank 0 only).
#ifndef LOOM_WORKER_TRAIN_CHECKPOINT_CHECKPOINT_H_
#define LOOM_WORKER_TRAIN_CHECKPOINT_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "worker/train/config/rank_env.h"
#include "worker/train/model/dims.h"
#include "worker/train/model/params.h"

namespace loom::train {

class GPT;
class AdamW;

// What a checkpoint records besides the tensors.
struct CheckpointMeta {
  int64_t step = 0;                      // completed optimizer steps
  uint64_t seed = 0;                     // the data order and initialisation seed
  int64_t generation = 1;                // LOOM_JOB_GENERATION of the run that saved it
  int B = 0, T = 0, K = 0, dp_size = 1;  // the layout that saved it
  int tp_size = 1, pp_size = 1;
  std::vector<int> blocks_per_stage;  // blocks of each pipeline stage; may be empty
  bool zero1 = false;                 // the optimizer state was sharded over dp when saved
  ModelDims dims;
  int64_t optimizer_step = -1;  // AdamW's step count; -1 when saving: the same as `step`
  // The shards of the checkpoint. CommitCheckpoint: the expected shard names (files of other
  // names in the staging directory are stale and dropped), or empty to take whatever shards
  // the staging directory holds. Loading: the shards found.
  std::vector<std::string> shards;
  bool has_optimizer_state = true;  // loading: whether optimizer files exist
};

// The manifest of a save at `step` of `generation` under `shape`'s layout, for a model of `dims`
// trained from `seed`: every field but zero1 and optimizer_step (the trainer's to set).
CheckpointMeta MetaOf(const BatchShape& shape, const ModelDims& dims, uint64_t seed, int64_t step,
                      int64_t generation);

// "step-000100".
std::string CheckpointDirName(int64_t step);

// "pp01-tp00": the conventional shard name of a pipeline stage's tensor rank.
std::string ShardName(int pp_rank, int tp_rank);

// Creates (if needed) and returns the staging directory of `step` for this `generation`:
// <root>/step-000100.gen-<generation>.partial. Safe to call from several processes at once;
// never removes anything. Throws IoError.
std::string StageCheckpoint(const std::string& root, int64_t step, int64_t generation);

// Which part of the optimizer state a rank's m and v buffers hold: the elements [begin, end)
// of the buffer laid out by its table (ZeRO-1: one data-parallel rank's share, AdamW's
// begin()/end()); m and v then hold end - begin floats. The default is the whole buffer.
struct MomentRange {
  size_t begin = 0;
  size_t end = static_cast<size_t>(-1);  // clipped to the table's size
};

// Writes one shard into `staging_dir`:
//   - when `params` is given: model-<shard_name>.safetensors with the tensors of `table` this
//     shard owns (numel > 0 and owner), read from `params` laid out by `table`;
//   - when m and v are given (both or neither): optimizer-<shard_name>.safetensors with their
//     moments of the owned tensors within `range` (a tensor cut by the range's ends is stored as
//     up to 2 * rank - 1 boxes, "m.<name>", "m.<name>@1", ...).
// Under ZeRO-1 without gathering, dp rank 0 of each (pp, tp) writes params and its moments,
// the other dp ranks only their moments, each under its own shard name. Each file is written
// to a temporary name, fsynced and renamed, so it appears whole or not at all; other shard names
// may be written into the same directory at the same time. A file of this shard name that
// this call does not write (left by a crashed earlier run) is removed. shard_name: letters,
// digits, '-' and '_' only ("" = the single-file names). Throws IoError.
void WriteShard(const std::string& staging_dir, const std::string& shard_name,
                const std::vector<TensorInfo>& table, const float* params, const float* m,
                const float* v, const MomentRange& range = {});

// Publishes the staged checkpoint, once every shard is written (the caller's barrier):
// checks that the shards' boxes cover every element of every tensor of a model of meta.dims
// exactly once (the optimizer's m and v too, when any shard saved moments), writes manifest.json
// last, renames `staging_dir` to <root>/step-<meta.step> (replacing a checkpoint of the same step
// only once the new one is complete), fsyncs `root`, and removes the staging directories of
// older generations. Returns the checkpoint's directory. An incomplete or overlapping set of
// shards is an IoError naming the tensor and the region (nothing is published); so is any
// file system failure.
std::string CommitCheckpoint(const std::string& root, const std::string& staging_dir,
                             const CheckpointMeta& meta);

// The manifest of the checkpoint in `dir`, without loading tensors. InputError when it is
// missing or malformed.
CheckpointMeta ReadCheckpointMeta(const std::string& dir);

// Loads the checkpoint in `dir`, written under any layout (or in the first, single-file
// format), into the tensors of `table` this rank holds (numel > 0, owner or not): each one's
// box is filled from the intersecting boxes of all shards, reading only those parts. `params`
// may be nullptr (skip the parameters). m and v (both or neither; nullptr skips them) receive
// the optimizer moments of `range` of the table's buffer. Returns the metadata (the caller sets
// AdamW's step from optimizer_step). A checkpoint of other dimensions than `dims`, a missing,
// truncated or mis-shaped file, a region no shard covers, or asking for optimizer state the
// checkpoint lacks is an InputError naming the file and what was expected (the buffers'
// contents are then unspecified).
CheckpointMeta LoadShardedCheckpoint(const std::string& dir, const ModelDims& dims,
                                     const std::vector<TensorInfo>& table, float* params, float* m,
                                     float* v, const MomentRange& range = {});

// Single-rank convenience: saves `model` and `optimizer` (one shard with the single-file
// names, through the protocol above) at meta.step under `root` (created if needed) and returns
// its directory. Throws IoError; on failure existing checkpoints are untouched.
std::string SaveCheckpoint(const std::string& root, const GPT& model, const AdamW& optimizer,
                           const CheckpointMeta& meta);

// The same from host buffers laid out by `table` (the whole model's; m and v may be nullptr
// together): for trainers whose state lives elsewhere (the GPU trainer's host copy). The
// caller sets meta.optimizer_step.
std::string SaveCheckpoint(const std::string& root, const std::vector<TensorInfo>& table,
                           const float* params, const float* m, const float* v,
                           const CheckpointMeta& meta);

// The directory of the newest complete checkpoint under `root` (highest step whose
// manifest.json exists and parses), or nullopt when there is none or `root` does not exist.
// Staging directories (.partial) are never candidates.
std::optional<std::string> FindLatestCheckpoint(const std::string& root);

// Every complete checkpoint under `root` as (step, directory), ascending step; empty when there
// is none or `root` does not exist. Same rules as FindLatestCheckpoint.
std::vector<std::pair<int64_t, std::string>> ListCompleteCheckpoints(const std::string& root);

// LoadShardedCheckpoint into `model`'s table and `optimizer`'s moments, then sets the
// optimizer's step.
CheckpointMeta LoadCheckpoint(const std::string& dir, GPT* model, AdamW* optimizer);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CHECKPOINT_CHECKPOINT_H_
