#include "worker/train/checkpoint/checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "worker/train/checkpoint/fs.h"
#include "worker/train/checkpoint/reshard.h"
#include "worker/train/checkpoint/safetensors.h"
#include "worker/train/checkpoint/shard_files.h"
#include "worker/train/config/json.h"
#include "worker/train/error.h"
#include "worker/train/model/gpt.h"
#include "worker/train/optim/adamw.h"

namespace loom::train {
namespace {

constexpr const char* kManifest = "manifest.json";

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

uint64_t FileSize(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Removes a checkpoint-shaped directory: its regular files, then itself. Only flat directories
// are expected (this code creates no subdirectories).
void RemoveFlatDir(const std::string& dir) {
  for (const std::string& name : ListDir(dir)) {
    std::string path = dir + "/" + name;
    if (::unlink(path.c_str()) != 0 && errno == EISDIR) ::rmdir(path.c_str());
  }
  ::rmdir(dir.c_str());
}

// Parses the decimal integer at the start of `s`; sets *rest past it.
std::optional<int64_t> LeadingInt(const std::string& s, size_t* rest) {
  int64_t value = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || ptr == s.data() || value < 0) return std::nullopt;
  *rest = static_cast<size_t>(ptr - s.data());
  return value;
}

// Parses the step of a "step-NNNNNN" name; nullopt for any other name.
std::optional<int64_t> StepOfName(const std::string& name) {
  if (name.rfind("step-", 0) != 0) return std::nullopt;
  size_t used = 0;
  std::optional<int64_t> step = LeadingInt(name.substr(5), &used);
  if (!step || 5 + used != name.size()) return std::nullopt;
  return step;
}

// The generation of a staging directory name: "step-N.gen-G.partial" gives G, the first
// format's "step-N.partial" gives 0; nullopt for any other name.
std::optional<int64_t> StagingGeneration(const std::string& name) {
  const std::string suffix = ".partial";
  if (name.rfind("step-", 0) != 0 || name.size() <= suffix.size() ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  const std::string core = name.substr(0, name.size() - suffix.size());
  const size_t dot = core.find('.');
  if (dot == std::string::npos) return StepOfName(core) ? std::optional<int64_t>(0) : std::nullopt;
  if (!StepOfName(core.substr(0, dot)) || core.compare(dot, 5, ".gen-") != 0) return std::nullopt;
  size_t used = 0;
  const std::string gen = core.substr(dot + 5);
  std::optional<int64_t> g = LeadingInt(gen, &used);
  if (!g || used != gen.size()) return std::nullopt;
  return g;
}

int64_t GetInt(const Value& obj, const char* key, const std::string& where) {
  const Value* v = obj.Find(key);
  int64_t out = 0;
  if (v == nullptr || (v->kind != Value::Kind::kNumber && v->kind != Value::Kind::kString)) {
    throw BadInput(where, std::string("missing integer field \"") + key + "\"");
  }
  auto [ptr, ec] = std::from_chars(v->text.data(), v->text.data() + v->text.size(), out);
  if (ec != std::errc() || ptr != v->text.data() + v->text.size()) {
    throw BadInput(where, std::string("field \"") + key + "\" is not an integer");
  }
  return out;
}

int64_t GetIntOr(const Value& obj, const char* key, int64_t fallback, const std::string& where) {
  return obj.Find(key) == nullptr ? fallback : GetInt(obj, key, where);
}

struct ManifestFile {
  std::string name;
  uint64_t bytes;
};

}  // namespace

CheckpointMeta MetaOf(const BatchShape& shape, const ModelDims& dims, uint64_t seed, int64_t step,
                      int64_t generation) {
  CheckpointMeta meta;
  meta.step = step;
  meta.seed = seed;
  meta.generation = generation;
  meta.B = shape.B;
  meta.T = shape.T;
  meta.K = shape.K;
  meta.dp_size = shape.dp_size;
  meta.tp_size = shape.tp_size;
  meta.pp_size = shape.pp_size;
  for (int s = 0; s < shape.pp_size; ++s) {
    meta.blocks_per_stage.push_back(shape.stage_bounds[s + 1] - shape.stage_bounds[s]);
  }
  meta.dims = dims;
  return meta;
}

std::string CheckpointDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%06lld", static_cast<long long>(step));
  return buf;
}

std::string ShardName(int pp_rank, int tp_rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "pp%02d-tp%02d", pp_rank, tp_rank);
  return buf;
}

std::string StageCheckpoint(const std::string& root, int64_t step, int64_t generation) {
  const std::string dir =
      root + "/" + CheckpointDirName(step) + ".gen-" + std::to_string(generation) + ".partial";
  MakeDirs(dir);  // mkdir -p tolerates a concurrent creator (EEXIST)
  return dir;
}

void WriteShard(const std::string& staging_dir, const std::string& shard_name,
                const std::vector<TensorInfo>& table, const float* params, const float* m,
                const float* v, const MomentRange& range) {
  LOOM_CHECK(ValidShardName(shard_name), "WriteShard: bad shard name \"" + shard_name + "\"");
  LOOM_CHECK((m == nullptr) == (v == nullptr), "WriteShard: give both moments or neither");
  const size_t range_end = std::min(range.end, ParamCount(table));
  LOOM_CHECK(range.begin <= range_end, "WriteShard: empty-or-reversed moment range");
  std::map<std::string, std::string> model_meta = {{"format", "loom-checkpoint-shard"},
                                                   {"shard", shard_name}};
  std::map<std::string, std::string> optim_meta = model_meta;
  std::vector<TensorToWrite> model_tensors, moments_m, moments_v;
  for (const TensorInfo& t : table) {
    if (t.numel == 0 || !t.owner) continue;
    const Placement p = PlacementOf(t);
    LOOM_CHECK(static_cast<size_t>(Volume(p.box)) == t.numel,
               "WriteShard: tensor " + t.name + " holds " + std::to_string(t.numel) +
                   " elements, its box " + BoxString(p.box) + " another count");
    if (params != nullptr) {
      model_meta[BoxKey(t.name)] = BoxJson(p.view, p.box);
      model_tensors.push_back({t.name, t.shape, params + t.offset});
    }
    if (m == nullptr) continue;
    // The part of this tensor inside the moment range, as boxes.
    const size_t lo = std::max(range.begin, t.offset), hi = std::min(range_end, t.offset + t.numel);
    if (lo >= hi) continue;
    std::vector<std::pair<Box, int64_t>> parts;
    if (lo == t.offset && hi == t.offset + t.numel) {
      parts.emplace_back(p.box, 0);
    } else {
      parts = SplitFlatRange(p.box, static_cast<int64_t>(lo - t.offset),
                             static_cast<int64_t>(hi - t.offset));
    }
    for (size_t k = 0; k < parts.size(); ++k) {
      const auto& [box, first] = parts[k];
      const std::string suffix = k == 0 ? "" : "@" + std::to_string(k);
      // The whole box keeps the tensor's local shape; a part is stored in the view's dimensions.
      const std::vector<int64_t> shape = parts.size() == 1 && box == p.box ? t.shape : box.size;
      const size_t at = t.offset + static_cast<size_t>(first) - range.begin;
      for (const char* which : {"m.", "v."}) {
        const std::string name = which + t.name + suffix;
        optim_meta[BoxKey(name)] = BoxJson(p.view, box);
        (which[0] == 'm' ? moments_m : moments_v)
            .push_back({name, shape, (which[0] == 'm' ? m : v) + at});
      }
    }
  }
  // A file of this shard that this call does not write can only be stale (a crashed earlier
  // run of this step and generation): remove it, so the shard is exactly what was written now.
  const std::string model_path = staging_dir + "/" + ShardFile("model", shard_name);
  const std::string optim_path = staging_dir + "/" + ShardFile("optimizer", shard_name);
  if (params != nullptr) {
    WriteSafetensors(model_path, model_tensors, model_meta);
  } else {
    ::unlink(model_path.c_str());
  }
  if (m != nullptr) {
    for (TensorToWrite& t : moments_v) moments_m.push_back(t);
    WriteSafetensors(optim_path, moments_m, optim_meta);
  } else {
    ::unlink(optim_path.c_str());
  }
}

std::string CommitCheckpoint(const std::string& root, const std::string& staging_dir,
                             const CheckpointMeta& meta) {
  LOOM_CHECK(DimsProblem(meta.dims).empty(),
             "CommitCheckpoint: meta.dims is not a model: " + DimsProblem(meta.dims));
  if (!Exists(staging_dir)) throw IoError(staging_dir + ": no such staging directory");
  // What the staging directory holds: shard files, and leftovers of crashed writes.
  std::set<std::string> model_shards, optim_shards;
  for (const std::string& name : ListDir(staging_dir)) {
    const std::string path = staging_dir + "/" + name;
    const bool tmp = name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0;
    if (tmp || name == kManifest) {
      ::unlink(path.c_str());  // a half-written file, or the manifest of a failed commit
    } else if (auto s = ShardOfFile("model", name)) {
      model_shards.insert(*s);
    } else if (auto s = ShardOfFile("optimizer", name)) {
      optim_shards.insert(*s);
    }
  }
  std::vector<std::string> shards = meta.shards;
  if (shards.empty()) {
    std::set<std::string> all = model_shards;
    all.insert(optim_shards.begin(), optim_shards.end());
    shards.assign(all.begin(), all.end());
  } else {
    // Files of other shard names were left by an earlier run of this generation: drop them.
    const std::set<std::string> wanted(shards.begin(), shards.end());
    for (const bool optimizer : {false, true}) {
      std::set<std::string>* found = optimizer ? &optim_shards : &model_shards;
      for (auto it = found->begin(); it != found->end();) {
        if (wanted.count(*it)) {
          ++it;
          continue;
        }
        ::unlink((staging_dir + "/" + ShardFile(optimizer ? "optimizer" : "model", *it)).c_str());
        it = found->erase(it);
      }
    }
    for (const std::string& s : shards) {
      if (!model_shards.count(s) && !optim_shards.count(s)) {
        throw IoError(staging_dir + ": not a complete checkpoint: shard \"" + s + "\" (" +
                      ShardFile("model", s) + ") was not written");
      }
    }
  }
  if (model_shards.empty()) {
    throw IoError(staging_dir + ": not a checkpoint: no shard wrote parameters");
  }
  const bool has_optimizer = !optim_shards.empty();

  // Every element of every tensor exactly once, judged from the headers alone. When any shard
  // saved moments, they must cover the model as the parameters do: a shard that saved
  // parameters but no moments while others did leaves a gap that is reported.
  const std::map<std::string, Placement> globals = GlobalPlacements(meta.dims);
  std::vector<ManifestFile> files;
  try {
    for (const bool optimizer : {false, true}) {
      if (optimizer && !has_optimizer) break;
      const std::string kind = optimizer ? "optimizer" : "model";
      const std::vector<std::string> prefixes =
          optimizer ? std::vector<std::string>{"m.", "v."} : std::vector<std::string>{""};
      std::vector<std::string> paths;
      for (const std::string& s : optimizer ? optim_shards : model_shards) {
        paths.push_back(staging_dir + "/" + ShardFile(kind, s));
        files.push_back({ShardFile(kind, s), FileSize(paths.back())});
      }
      PieceSet set;
      OpenPieces(paths, prefixes, globals, &set);
      for (const std::string& prefix : prefixes) {
        for (const auto& [name, global] : globals) {
          const std::string stored = prefix + name;
          std::string problem = CoverageProblem(stored, FullBox(global.view), set.pieces[stored]);
          if (!problem.empty()) {
            throw IoError(staging_dir + ": not a complete checkpoint: " + problem);
          }
        }
      }
    }
  } catch (const InputError& e) {
    throw IoError(std::string("not a complete checkpoint: ") + e.what());
  }

  // The manifest, last: its presence is what makes the directory a checkpoint.
  const int64_t tokens_per_step = int64_t{meta.B} * meta.T * meta.K * meta.dp_size;
  JsonObject data_position;
  data_position.Add("sampler", "hash-v1")
      .Add("step", meta.step)
      .Add("sequences_consumed", meta.step * (tokens_per_step / (meta.T > 0 ? meta.T : 1)));
  JsonObject rng;  // all randomness is counter-based: the seed and the step determine it
  rng.Add("kind", "counter")
      .Add("seed", static_cast<uint64_t>(meta.seed))
      .Add("counter", meta.step);
  std::vector<int64_t> blocks(meta.blocks_per_stage.begin(), meta.blocks_per_stage.end());
  JsonObject layout;
  layout.Add("data", meta.dp_size)
      .Add("tensor", meta.tp_size)
      .Add("pipeline", meta.pp_size)
      .Add("micro_batch", meta.B)
      .Add("num_micro_batches", meta.K)
      .Add("seq_len", meta.T)
      .AddRaw("blocks_per_stage", IntArray(blocks))
      .Add("zero1", meta.zero1);
  JsonObject dims;
  dims.Add("layers", meta.dims.layers)
      .Add("hidden", meta.dims.channels)
      .Add("heads", meta.dims.heads)
      .Add("seq_len", meta.dims.max_seq_len)
      .Add("vocab", meta.dims.vocab);
  JsonObject optim;
  optim.Add("step", meta.optimizer_step >= 0 ? meta.optimizer_step : meta.step)
      .Add("state", has_optimizer);
  std::string shard_list = "[";
  for (size_t i = 0; i < shards.size(); ++i) {
    if (i) shard_list += ",";
    AppendJsonString(&shard_list, shards[i]);
  }
  shard_list += "]";
  std::string file_list = "[";
  for (size_t i = 0; i < files.size(); ++i) {
    JsonObject f;
    f.Add("name", files[i].name).Add("bytes", files[i].bytes);
    file_list += (i ? "," : "") + f.str();
  }
  file_list += "]";
  JsonObject manifest;
  manifest.Add("format", "loom-checkpoint")
      .Add("version", 2)
      .Add("step", meta.step)
      .Add("generation", meta.generation)
      .Add("seed", static_cast<uint64_t>(meta.seed))
      .AddRaw("data_position", data_position.str())
      .AddRaw("rng_state", rng.str())
      .AddRaw("layout", layout.str())
      .AddRaw("model", dims.str())
      .AddRaw("optimizer", optim.str())
      .AddRaw("shards", shard_list)
      .AddRaw("files", file_list);
  std::string text = manifest.str() + "\n";
  WriteFileAtomic(staging_dir + "/" + kManifest, text.data(), text.size());  // fsyncs the dir

  // Into place. An existing checkpoint of the same step is set aside first and removed only
  // once the new one is in place.
  const std::string final_dir = root + "/" + CheckpointDirName(meta.step);
  const std::string old = final_dir + ".old";
  bool replaced = false;
  if (Exists(final_dir)) {
    if (Exists(old)) RemoveFlatDir(old);
    if (::rename(final_dir.c_str(), old.c_str()) != 0) {
      throw IoError(final_dir +
                    ": cannot move the previous checkpoint aside: " + std::strerror(errno));
    }
    replaced = true;
  }
  if (::rename(staging_dir.c_str(), final_dir.c_str()) != 0) {
    int saved = errno;
    if (replaced) ::rename(old.c_str(), final_dir.c_str());
    throw IoError(final_dir + ": cannot rename the staged checkpoint: " + std::strerror(saved));
  }
  FsyncDir(root);
  if (replaced) RemoveFlatDir(old);
  // Staging left by crashed runs of older generations: their processes are gone (a gang dies
  // together), so nothing writes there any more.
  for (const std::string& name : ListDir(root)) {
    std::optional<int64_t> gen = StagingGeneration(name);
    if (gen && *gen < meta.generation) RemoveFlatDir(root + "/" + name);
  }
  return final_dir;
}

CheckpointMeta ReadCheckpointMeta(const std::string& dir) {
  const std::string manifest_path = dir + "/" + kManifest;
  Value m = ParseJson(ReadFileOrThrow(manifest_path), manifest_path);
  if (!m.is_object()) throw BadInput(manifest_path, "expected a JSON object");
  CheckpointMeta meta;
  meta.step = GetInt(m, "step", manifest_path);
  meta.generation = GetInt(m, "generation", manifest_path);
  meta.seed = static_cast<uint64_t>(GetInt(m, "seed", manifest_path));
  const Value* dims = m.Find("model");
  if (dims == nullptr || !dims->is_object()) throw BadInput(manifest_path, "missing \"model\"");
  meta.dims.layers = static_cast<int>(GetInt(*dims, "layers", manifest_path));
  meta.dims.channels = static_cast<int>(GetInt(*dims, "hidden", manifest_path));
  meta.dims.heads = static_cast<int>(GetInt(*dims, "heads", manifest_path));
  meta.dims.max_seq_len = static_cast<int>(GetInt(*dims, "seq_len", manifest_path));
  meta.dims.vocab = static_cast<int>(GetInt(*dims, "vocab", manifest_path));
  if (const Value* layout = m.Find("layout"); layout && layout->is_object()) {
    meta.B = static_cast<int>(GetInt(*layout, "micro_batch", manifest_path));
    meta.K = static_cast<int>(GetInt(*layout, "num_micro_batches", manifest_path));
    meta.T = static_cast<int>(GetInt(*layout, "seq_len", manifest_path));
    meta.dp_size = static_cast<int>(GetInt(*layout, "data", manifest_path));
    meta.tp_size = static_cast<int>(GetIntOr(*layout, "tensor", 1, manifest_path));
    meta.pp_size = static_cast<int>(GetIntOr(*layout, "pipeline", 1, manifest_path));
    if (layout->Find("blocks_per_stage") != nullptr) {
      for (int64_t b : GetIntArray(*layout, "blocks_per_stage", manifest_path)) {
        meta.blocks_per_stage.push_back(static_cast<int>(b));
      }
    }
    if (const Value* z = layout->Find("zero1")) meta.zero1 = z->text == "true";
  }
  const Value* optim = m.Find("optimizer");
  if (optim == nullptr || !optim->is_object()) {
    throw BadInput(manifest_path, "missing \"optimizer\"");
  }
  meta.optimizer_step = GetInt(*optim, "step", manifest_path);
  const Value* state = optim->Find("state");
  meta.has_optimizer_state = state == nullptr || state->text == "true";
  if (const Value* shards = m.Find("shards"); shards && shards->kind == Value::Kind::kArray) {
    for (const Value& s : shards->items) meta.shards.push_back(s.text);
  } else {
    meta.shards = {""};  // the first format: one shard with the single-file names
  }
  return meta;
}

CheckpointMeta LoadShardedCheckpoint(const std::string& dir, const ModelDims& dims,
                                     const std::vector<TensorInfo>& table, float* params, float* m,
                                     float* v, const MomentRange& range) {
  LOOM_CHECK((m == nullptr) == (v == nullptr), "LoadShardedCheckpoint: both moments or neither");
  const std::string manifest_path = dir + "/" + kManifest;
  CheckpointMeta meta = ReadCheckpointMeta(dir);
  if (!(meta.dims == dims)) {
    throw BadInput(manifest_path, "checkpoint model " + DimsString(meta.dims) +
                                      " does not match the configured model " + DimsString(dims));
  }
  // The file list guards against a file replaced or cut short after the manifest was written.
  Value manifest = ParseJson(ReadFileOrThrow(manifest_path), manifest_path);
  const Value* file_list = manifest.Find("files");
  if (file_list == nullptr || file_list->kind != Value::Kind::kArray) {
    throw BadInput(manifest_path, "missing \"files\"");
  }
  std::vector<std::string> model_paths, optim_paths;
  for (const Value& f : file_list->items) {
    const Value* name = f.Find("name");
    if (name == nullptr || name->kind != Value::Kind::kString) continue;
    const std::string path = dir + "/" + name->text;
    const uint64_t want = static_cast<uint64_t>(GetInt(f, "bytes", manifest_path));
    if (!Exists(path)) throw BadInput(path, "missing (listed in " + manifest_path + ")");
    if (FileSize(path) != want) {
      throw BadInput(path, std::to_string(FileSize(path)) + " bytes, the manifest lists " +
                               std::to_string(want) + " (truncated or replaced)");
    }
    if (ShardOfFile("model", name->text)) model_paths.push_back(path);
    if (ShardOfFile("optimizer", name->text)) optim_paths.push_back(path);
  }
  if (model_paths.empty()) throw BadInput(manifest_path, "lists no model file");
  meta.has_optimizer_state = meta.has_optimizer_state && !optim_paths.empty();
  if (m != nullptr && !meta.has_optimizer_state) {
    throw BadInput(manifest_path,
                   "the checkpoint holds no optimizer state (saved without it); expected "
                   "optimizer*.safetensors");
  }

  const std::map<std::string, Placement> globals = GlobalPlacements(dims);
  const size_t range_end = std::min(range.end, ParamCount(table));
  LOOM_CHECK(range.begin <= range_end, "LoadShardedCheckpoint: reversed moment range");
  std::vector<float> window;
  for (const bool optimizer : {false, true}) {
    if (!optimizer && params == nullptr) continue;
    if (optimizer && m == nullptr) break;
    const std::vector<std::string> prefixes =
        optimizer ? std::vector<std::string>{"m.", "v."} : std::vector<std::string>{""};
    PieceSet set;
    OpenPieces(optimizer ? optim_paths : model_paths, prefixes, globals, &set);
    // Every region is checked for coverage before anything is read; the copies are then done
    // file by file.
    struct Copy {
      const Piece* piece;
      Box box;     // the destination box (of the view) the piece meets
      float* dst;  // its row-major data
    };
    std::map<const SafetensorsFile*, std::vector<Copy>> copies;
    for (const TensorInfo& t : table) {
      if (t.numel == 0) continue;
      auto global = globals.find(t.name);
      LOOM_CHECK(global != globals.end(), "LoadShardedCheckpoint: unknown tensor " + t.name);
      const Placement p = PlacementOf(t);
      LOOM_CHECK(p.view == global->second.view && Contains(FullBox(p.view), p.box) &&
                     static_cast<size_t>(Volume(p.box)) == t.numel,
                 "LoadShardedCheckpoint: the table's box of " + t.name + " does not fit");
      // The boxes to fill, and where their data starts in the destination buffer: the whole
      // tensor for the parameters, the part inside the range for the moments.
      std::vector<std::pair<Box, size_t>> targets;
      if (!optimizer) {
        targets.emplace_back(p.box, t.offset);
      } else {
        const size_t lo = std::max(range.begin, t.offset);
        const size_t hi = std::min(range_end, t.offset + t.numel);
        if (lo >= hi) continue;
        for (auto& [box, first] : SplitFlatRange(p.box, static_cast<int64_t>(lo - t.offset),
                                                 static_cast<int64_t>(hi - t.offset))) {
          targets.emplace_back(box, t.offset + static_cast<size_t>(first) - range.begin);
        }
      }
      for (const std::string& prefix : prefixes) {
        float* base = !optimizer ? params : prefix == "m." ? m : v;
        const std::string stored = prefix + t.name;
        const std::vector<Piece>& pieces = set.pieces[stored];
        for (const auto& [box, at] : targets) {
          std::string problem = CoverageProblem(stored, box, pieces);
          if (!problem.empty()) throw BadInput(dir, problem);
          for (const Piece& piece : pieces) {
            if (Intersect(piece.box, box)) copies[piece.file].push_back({&piece, box, base + at});
          }
        }
      }
    }
    // File by file, so that one descriptor is open at a time however many shards there are.
    for (const std::unique_ptr<SafetensorsFile>& file : set.files) {
      auto jobs = copies.find(file.get());
      if (jobs == copies.end()) continue;
      file->Reopen();
      for (const Copy& c : jobs->second) CopyPiece(*c.piece, c.box, c.dst, &window);
      file->Close();
    }
  }
  return meta;
}

std::string SaveCheckpoint(const std::string& root, const std::vector<TensorInfo>& table,
                           const float* params, const float* m, const float* v,
                           const CheckpointMeta& meta) {
  MakeDirs(root);
  // One writer: whatever an earlier crashed save of this step and generation left is stale.
  const std::string staging = StageCheckpoint(root, meta.step, meta.generation);
  RemoveFlatDir(staging);
  MakeDirs(staging);
  WriteShard(staging, "", table, params, m, v);
  CheckpointMeta full = meta;
  full.shards = {""};
  return CommitCheckpoint(root, staging, full);
}

std::string SaveCheckpoint(const std::string& root, const GPT& model, const AdamW& optimizer,
                           const CheckpointMeta& meta) {
  CheckpointMeta full = meta;
  full.optimizer_step = optimizer.step();
  return SaveCheckpoint(root, model.tensors(), model.params(), optimizer.m(), optimizer.v(), full);
}

std::vector<std::pair<int64_t, std::string>> ListCompleteCheckpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  DIR* d = ::opendir(root.c_str());
  if (d == nullptr) return found;
  while (dirent* e = ::readdir(d)) {
    std::optional<int64_t> step = StepOfName(e->d_name);
    if (!step) continue;
    const std::string dir = root + "/" + e->d_name;
    const std::string manifest = dir + "/" + kManifest;
    if (!Exists(manifest)) continue;  // incomplete: not a checkpoint
    try {
      Value m = ParseJson(ReadFileOrThrow(manifest), manifest);
      if (!m.is_object() || GetInt(m, "step", manifest) != *step) continue;
    } catch (const InputError& e) {
      std::fprintf(stderr, "loom-train: ignoring checkpoint: %s\n", e.what());
      continue;
    }
    found.push_back({*step, dir});
  }
  ::closedir(d);
  std::sort(found.begin(), found.end());
  return found;
}

std::optional<std::string> FindLatestCheckpoint(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> all = ListCompleteCheckpoints(root);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

CheckpointMeta LoadCheckpoint(const std::string& dir, GPT* model, AdamW* optimizer) {
  CheckpointMeta meta = LoadShardedCheckpoint(dir, model->dims(), model->tensors(), model->params(),
                                              optimizer->m(), optimizer->v());
  optimizer->set_step(meta.optimizer_step);
  return meta;
}

}  // namespace loom::train
