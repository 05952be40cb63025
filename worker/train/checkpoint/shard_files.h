// The files of a checkpoint shard (checkpoint.h): their names, the box each stored tensor is
// of the whole model's tensor, and reading boxes out of them. Internal to checkpoint/.
//
// A stored tensor "<prefix><name>[@<k>]" (prefix "" in model files, "m." or "v." in optimizer
// files; @k numbers the further boxes of one tensor in one file) is a box of tensor <name>'s
// view, recorded in the file's __metadata__ under "box.<stored name>" as
// {"view": [...], "start": [...], "size": [...]}. A tensor without that key is the whole tensor
// in its global shape (the first, single-file format).
#ifndef LOOM_WORKER_TRAIN_CHECKPOINT_SHARD_FILES_H_
#define LOOM_WORKER_TRAIN_CHECKPOINT_SHARD_FILES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "worker/train/checkpoint/reshard.h"
#include "worker/train/checkpoint/safetensors.h"
#include "worker/train/config/json.h"
#include "worker/train/model/dims.h"
#include "worker/train/model/params.h"

namespace loom::train {

// Letters, digits, '-' and '_' only (possibly empty).
bool ValidShardName(const std::string& name);

// "model-<shard>.safetensors", or "model.safetensors" for the shard "" (kind: "model" or
// "optimizer").
std::string ShardFile(const std::string& kind, const std::string& shard);

// The shard of a "<kind>[-<shard>].safetensors" file name, or nullopt.
std::optional<std::string> ShardOfFile(const std::string& kind, const std::string& file);

// The __metadata__ key of a stored tensor's box: "box.<stored name>".
inline std::string BoxKey(const std::string& stored_name) { return "box." + stored_name; }

// The __metadata__ value of a box of `view`.
std::string BoxJson(const std::vector<int64_t>& view, const Box& box);

// "[1,2,3]".
std::string IntArray(const std::vector<int64_t>& v);

// The integer array obj[key]; InputError "where: ..." when missing or not integers.
std::vector<int64_t> GetIntArray(const Value& obj, const char* key, const std::string& where);

// Where a tensor of a table sits in the whole model's tensor: its view and its box. Tables
// without the shard fields (whole-model tables) hold the full view.
struct Placement {
  std::vector<int64_t> global_shape;
  std::vector<int64_t> view;
  Box box;
};
Placement PlacementOf(const TensorInfo& t);

// The whole model's tensors by name: the authority on each tensor's view.
std::map<std::string, Placement> GlobalPlacements(const ModelDims& dims);

// One stored box of a tensor: which file, which entry, and where it sits.
struct Piece {
  const SafetensorsFile* file;
  const SafetensorsFile::Entry* entry;
  Box box;
};

// The open files of one kind (model or optimizer) of a checkpoint, and their boxes keyed by
// prefix and tensor name ("qkvw", "m.qkvw").
struct PieceSet {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, std::vector<Piece>> pieces;
};

// Opens `paths`, collects their boxes and closes them again (Reopen before reading data). Stored
// names must be <prefix><name>[@k] for one of `prefixes` and a tensor of `globals`. Throws
// InputError naming the file for anything that does not fit: unknown tensor, a box of another view
// or outside it, an element count other than the box's, a whole tensor of another shape, a
// malformed file.
void OpenPieces(const std::vector<std::string>& paths, const std::vector<std::string>& prefixes,
                const std::map<std::string, Placement>& globals, PieceSet* set);

// Copies the part of `piece` inside `dst_box` into `dst` (the row-major data of dst_box),
// reading only what it needs from the file, which must be open. `window` is scratch reused
// across calls.
void CopyPiece(const Piece& piece, const Box& dst_box, float* dst, std::vector<float>* window);

// The first way in which `pieces` fail to tile `target` of stored tensor `name`, as a message
// naming the region and the files, or "" when they tile it exactly.
std::string CoverageProblem(const std::string& name, const Box& target,
                            const std::vector<Piece>& pieces);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CHECKPOINT_SHARD_FILES_H_
