// Checkpoints: one directory per saved step, <root>/step-000100/, holding
//   model.safetensors      the parameters (tensor names of ParamTable)
//   optimizer.safetensors  AdamW's moments, "m.<name>" and "v.<name>"
//   manifest.json          step, data position, RNG state, layout, generation, file list
// The manifest is written last; a directory without one is not a checkpoint. A save is staged
// in <root>/step-000100.partial/ and renamed into place, so a failed save leaves every existing
// checkpoint as it was.
#ifndef LOOM_WORKER_TRAIN_CHECKPOINT_CHECKPOINT_H_
#define LOOM_WORKER_TRAIN_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "worker/train/model/dims.h"

namespace loom::train {

class GPT;
class AdamW;

// What a checkpoint records besides the tensors.
struct CheckpointMeta {
  int64_t step = 0;                      // completed optimizer steps
  uint64_t seed = 0;                     // the data order and initialisation seed
  int64_t generation = 1;                // LOOM_JOB_GENERATION of the run that saved it
  int B = 0, T = 0, K = 0, dp_size = 1;  // the layout that saved it
  ModelDims dims;
};

// Saves a checkpoint of `model` and `optimizer` at meta.step under `root` (created if needed)
// and returns its directory. Throws IoError; on failure existing checkpoints are untouched.
std::string SaveCheckpoint(const std::string& root, const GPT& model, const AdamW& optimizer,
                           const CheckpointMeta& meta);

// The directory of the newest complete checkpoint under `root` (highest step whose
// manifest.json exists and parses), or nullopt when there is none or `root` does not exist.
std::optional<std::string> FindLatestCheckpoint(const std::string& root);

// Loads the checkpoint in `dir` into `model` and `optimizer` and returns its metadata. A
// checkpoint of other dimensions, or with missing, truncated or mis-shaped files, is an
// InputError naming the file and what was expected (the model's contents are then
// unspecified).
CheckpointMeta LoadCheckpoint(const std::string& dir, GPT* model, AdamW* optimizer);

// "step-000100".
std::string CheckpointDirName(int64_t step);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CHECKPOINT_CHECKPOINT_H_
