#include "worker/train/checkpoint/checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <vector>

#include "worker/train/checkpoint/fs.h"
#include "worker/train/checkpoint/safetensors.h"
#include "worker/train/config/json.h"
#include "worker/train/error.h"
#include "worker/train/model/gpt.h"
#include "worker/train/optim/adamw.h"

namespace loom::train {
namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

uint64_t FileSize(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// Removes a checkpoint-shaped directory: its regular files, then itself. Only flat directories
// are expected (this code creates no subdirectories).
void RemoveFlatDir(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      std::string path = dir + "/" + name;
      if (::unlink(path.c_str()) != 0 && errno == EISDIR) ::rmdir(path.c_str());
    }
    ::closedir(d);
  }
  ::rmdir(dir.c_str());
}

// Parses the step of a "step-NNNNNN" name; nullopt for any other name.
std::optional<int64_t> StepOfName(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5) return std::nullopt;
  int64_t step = 0;
  const char* first = name.data() + 5;
  const char* last = name.data() + name.size();
  auto [ptr, ec] = std::from_chars(first, last, step);
  if (ec != std::errc() || ptr != last || step < 0) return std::nullopt;
  return step;
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

std::vector<TensorToWrite> ModelTensors(const std::vector<TensorInfo>& table, const float* base,
                                        const std::string& prefix) {
  std::vector<TensorToWrite> out;
  for (const TensorInfo& t : table) out.push_back({prefix + t.name, t.shape, base + t.offset});
  return out;
}

std::vector<TensorToRead> ModelSlots(const std::vector<TensorInfo>& table, float* base,
                                     const std::string& prefix) {
  std::vector<TensorToRead> out;
  for (const TensorInfo& t : table) out.push_back({prefix + t.name, t.shape, base + t.offset});
  return out;
}

}  // namespace

std::string CheckpointDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%06lld", static_cast<long long>(step));
  return buf;
}

std::string SaveCheckpoint(const std::string& root, const GPT& model, const AdamW& optimizer,
                           const CheckpointMeta& meta) {
  MakeDirs(root);
  const std::string final_dir = root + "/" + CheckpointDirName(meta.step);
  const std::string staging = final_dir + ".partial";
  if (Exists(staging)) RemoveFlatDir(staging);  // left by a crashed save
  MakeDirs(staging);

  const std::vector<TensorInfo>& table = model.tensors();
  std::map<std::string, std::string> file_meta = {{"format", "loom-checkpoint"},
                                                  {"step", std::to_string(meta.step)}};
  WriteSafetensors(staging + "/" + kModelFile, ModelTensors(table, model.params(), ""), file_meta);
  std::vector<TensorToWrite> moments = ModelTensors(table, optimizer.m(), "m.");
  for (TensorToWrite& t : ModelTensors(table, optimizer.v(), "v.")) moments.push_back(t);
  WriteSafetensors(staging + "/" + kOptimizerFile, moments, file_meta);

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
  JsonObject layout;
  layout.Add("data", meta.dp_size)
      .Add("tensor", 1)
      .Add("pipeline", 1)
      .Add("micro_batch", meta.B)
      .Add("num_micro_batches", meta.K)
      .Add("seq_len", meta.T);
  JsonObject dims;
  dims.Add("layers", meta.dims.layers)
      .Add("hidden", meta.dims.channels)
      .Add("heads", meta.dims.heads)
      .Add("seq_len", meta.dims.max_seq_len)
      .Add("vocab", meta.dims.vocab);
  JsonObject optim;
  optim.Add("step", optimizer.step());
  std::string files = "[";
  for (const char* name : {kModelFile, kOptimizerFile}) {
    JsonObject f;
    f.Add("name", name).Add("bytes", FileSize(staging + "/" + name));
    files += (files.size() > 1 ? "," : "") + f.str();
  }
  files += "]";
  JsonObject manifest;
  manifest.Add("format", "loom-checkpoint")
      .Add("version", 1)
      .Add("step", meta.step)
      .Add("generation", meta.generation)
      .Add("seed", static_cast<uint64_t>(meta.seed))
      .AddRaw("data_position", data_position.str())
      .AddRaw("rng_state", rng.str())
      .AddRaw("layout", layout.str())
      .AddRaw("model", dims.str())
      .AddRaw("optimizer", optim.str())
      .AddRaw("files", files);
  std::string text = manifest.str() + "\n";
  WriteFileAtomic(staging + "/" + kManifest, text.data(), text.size());

  // Into place. An existing checkpoint of the same step is set aside first and removed only
  // once the new one is in place.
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
  if (::rename(staging.c_str(), final_dir.c_str()) != 0) {
    int saved = errno;
    if (replaced) ::rename(old.c_str(), final_dir.c_str());
    throw IoError(final_dir + ": cannot rename the staged checkpoint: " + std::strerror(saved));
  }
  FsyncDir(root);
  if (replaced) RemoveFlatDir(old);
  return final_dir;
}

std::optional<std::string> FindLatestCheckpoint(const std::string& root) {
  DIR* d = ::opendir(root.c_str());
  if (d == nullptr) return std::nullopt;
  std::optional<std::string> best;
  int64_t best_step = -1;
  while (dirent* e = ::readdir(d)) {
    std::optional<int64_t> step = StepOfName(e->d_name);
    if (!step || *step <= best_step) continue;
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
    best_step = *step;
    best = dir;
  }
  ::closedir(d);
  return best;
}

CheckpointMeta LoadCheckpoint(const std::string& dir, GPT* model, AdamW* optimizer) {
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
  if (!(meta.dims == model->dims())) {
    throw BadInput(manifest_path, "checkpoint model " + DimsString(meta.dims) +
                                      " does not match the configured model " +
                                      DimsString(model->dims()));
  }
  if (const Value* layout = m.Find("layout"); layout && layout->is_object()) {
    meta.B = static_cast<int>(GetInt(*layout, "micro_batch", manifest_path));
    meta.K = static_cast<int>(GetInt(*layout, "num_micro_batches", manifest_path));
    meta.T = static_cast<int>(GetInt(*layout, "seq_len", manifest_path));
    meta.dp_size = static_cast<int>(GetInt(*layout, "data", manifest_path));
  }
  const Value* optim = m.Find("optimizer");
  if (optim == nullptr || !optim->is_object()) {
    throw BadInput(manifest_path, "missing \"optimizer\"");
  }
  const int64_t optimizer_step = GetInt(*optim, "step", manifest_path);
  // The file list guards against a file replaced or cut short after the manifest was written.
  if (const Value* files = m.Find("files"); files && files->kind == Value::Kind::kArray) {
    for (const Value& f : files->items) {
      const Value* name = f.Find("name");
      if (name == nullptr) continue;
      const std::string path = dir + "/" + name->text;
      const uint64_t want = static_cast<uint64_t>(GetInt(f, "bytes", manifest_path));
      if (!Exists(path)) throw BadInput(path, "missing (listed in " + manifest_path + ")");
      if (FileSize(path) != want) {
        throw BadInput(path, std::to_string(FileSize(path)) + " bytes, the manifest lists " +
                                 std::to_string(want) + " (truncated or replaced)");
      }
    }
  }
  const std::vector<TensorInfo>& table = model->tensors();
  ReadSafetensors(dir + "/" + kModelFile, ModelSlots(table, model->params(), ""));
  std::vector<TensorToRead> moments = ModelSlots(table, optimizer->m(), "m.");
  for (TensorToRead& t : ModelSlots(table, optimizer->v(), "v.")) moments.push_back(t);
  ReadSafetensors(dir + "/" + kOptimizerFile, moments);
  optimizer->set_step(optimizer_step);
  return meta;
}

}  // namespace loom::train
