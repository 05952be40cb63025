#include "worker/train/checkpoint/shard_files.h"

#include <algorithm>
#include <charconv>
#include <cstring>

#include "worker/train/error.h"

namespace loom::train {
namespace {

constexpr const char* kSuffix = ".safetensors";

// Reads of the source file for runs shorter than this go through a window buffer of this size
// (many short runs, e.g. a column slice of a row-parallel matrix, become few large reads);
// longer runs are read straight into their destination.
constexpr int64_t kWindowFloats = int64_t{1} << 18;  // 1 MiB

// Reads the boxes of every tensor in `file` into `pieces`, keyed by prefix and tensor name
// ("qkvw", "m.qkvw"). Stored names are <prefix><name>[@<index>] for one of `prefixes` and a
// tensor name of `globals`. A tensor without a recorded box is a whole tensor (the first format).
// Throws InputError naming the file for anything that does not fit a model with `globals`.
void CollectPieces(const SafetensorsFile& file, const std::vector<std::string>& prefixes,
                   const std::map<std::string, Placement>& globals,
                   std::map<std::string, std::vector<Piece>>* pieces) {
  const std::string& path = file.path();
  for (const auto& [stored_name, entry] : file.tensors()) {
    // "m.qkvw@2": the third box of m.qkvw in this file (a ZeRO-1 range cut the tensor).
    std::string key = stored_name;
    if (size_t at = key.rfind('@'); at != std::string::npos) {
      const std::string index = key.substr(at + 1);
      if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos) {
        throw BadInput(path, "unexpected tensor \"" + stored_name + "\" (a different model?)");
      }
      key.resize(at);
    }
    auto global = globals.end();
    for (const std::string& prefix : prefixes) {
      if (key.rfind(prefix, 0) == 0) global = globals.find(key.substr(prefix.size()));
      if (global != globals.end()) break;
    }
    if (global == globals.end()) {
      throw BadInput(path, "unexpected tensor \"" + stored_name + "\" (a different model?)");
    }
    const Placement& want = global->second;
    Box box;
    auto meta = file.metadata().find(BoxKey(stored_name));
    if (meta == file.metadata().end()) {
      if (entry.shape != want.global_shape) {
        throw BadInput(path, "tensor \"" + stored_name + "\" has shape " +
                                 ShapeString(entry.shape) + ", the model expects " +
                                 ShapeString(want.global_shape));
      }
      box = FullBox(want.view);
    } else {
      const std::string where = path + ": " + meta->first;
      Value v = ParseJson(meta->second, where);
      if (!v.is_object()) throw BadInput(where, "expected a JSON object");
      const std::vector<int64_t> view = GetIntArray(v, "view", where);
      box.start = GetIntArray(v, "start", where);
      box.size = GetIntArray(v, "size", where);
      if (view != want.view) {
        throw BadInput(path, "tensor \"" + stored_name + "\" is a box of a " + ShapeString(view) +
                                 " tensor, the model's is " + ShapeString(want.view));
      }
      if (box.start.size() != view.size() || box.size.size() != view.size() ||
          !Contains(FullBox(view), box)) {
        throw BadInput(path, "tensor \"" + stored_name + "\": box " + BoxString(box) +
                                 " does not fit the view " + ShapeString(view));
      }
      if (static_cast<uint64_t>(Volume(box)) != entry.numel) {
        throw BadInput(path, "tensor \"" + stored_name + "\" has shape " +
                                 ShapeString(entry.shape) + ", its box " + BoxString(box) +
                                 " holds " + std::to_string(Volume(box)) + " elements");
      }
    }
    (*pieces)[key].push_back(Piece{&file, &entry, std::move(box)});
  }
}

// The names of the shard files of `pieces` (for messages).
std::string FileOf(const Piece& p) {
  const std::string& path = p.file->path();
  return path.substr(path.find_last_of('/') + 1);
}

}  // namespace

bool ValidShardName(const std::string& name) {
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_';
    if (!ok) return false;
  }
  return true;
}

std::string ShardFile(const std::string& kind, const std::string& shard) {
  return kind + (shard.empty() ? "" : "-" + shard) + kSuffix;
}

std::optional<std::string> ShardOfFile(const std::string& kind, const std::string& file) {
  const std::string suffix = kSuffix;
  if (file.size() < kind.size() + suffix.size() || file.rfind(kind, 0) != 0 ||
      file.compare(file.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  std::string middle = file.substr(kind.size(), file.size() - kind.size() - suffix.size());
  if (middle.empty()) return std::string();
  if (middle[0] != '-' || middle.size() == 1) return std::nullopt;
  middle = middle.substr(1);
  if (!ValidShardName(middle)) return std::nullopt;
  return middle;
}

std::string IntArray(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

std::string BoxJson(const std::vector<int64_t>& view, const Box& box) {
  JsonObject o;
  o.AddRaw("view", IntArray(view))
      .AddRaw("start", IntArray(box.start))
      .AddRaw("size", IntArray(box.size));
  return o.str();
}

std::vector<int64_t> GetIntArray(const Value& obj, const char* key, const std::string& where) {
  const Value* v = obj.Find(key);
  if (v == nullptr || v->kind != Value::Kind::kArray) {
    throw BadInput(where, std::string("missing integer array \"") + key + "\"");
  }
  std::vector<int64_t> out;
  for (const Value& item : v->items) {
    int64_t x = 0;
    auto [ptr, ec] = std::from_chars(item.text.data(), item.text.data() + item.text.size(), x);
    if (item.kind != Value::Kind::kNumber || ec != std::errc() ||
        ptr != item.text.data() + item.text.size()) {
      throw BadInput(where, std::string("\"") + key + "\" holds a non-integer");
    }
    out.push_back(x);
  }
  return out;
}

Placement PlacementOf(const TensorInfo& t) {
  Placement p;
  p.global_shape = t.global_shape.empty() ? t.shape : t.global_shape;
  if (!t.view_shape.empty()) {
    p.view = t.view_shape;
  } else if (t.name == "qkvw" && p.global_shape.size() == 3) {  // (L, 3C, C) as (L, 3, C, C)
    p.view = {p.global_shape[0], 3, p.global_shape[1] / 3, p.global_shape[2]};
  } else if (t.name == "qkvb" && p.global_shape.size() == 2) {  // (L, 3C) as (L, 3, C)
    p.view = {p.global_shape[0], 3, p.global_shape[1] / 3};
  } else {
    p.view = p.global_shape;
  }
  p.box = t.box_start.empty() ? FullBox(p.view) : Box{t.box_start, t.box_size};
  return p;
}

std::map<std::string, Placement> GlobalPlacements(const ModelDims& dims) {
  std::map<std::string, Placement> out;
  for (const TensorInfo& t : ParamTable(dims)) out[t.name] = PlacementOf(t);
  return out;
}

void OpenPieces(const std::vector<std::string>& paths, const std::vector<std::string>& prefixes,
                const std::map<std::string, Placement>& globals, PieceSet* set) {
  for (const std::string& path : paths) {
    set->files.push_back(std::make_unique<SafetensorsFile>(path));
    CollectPieces(*set->files.back(), prefixes, globals, &set->pieces);
    set->files.back()->Close();  // the header is all a commit or a coverage check needs
  }
}

void CopyPiece(const Piece& piece, const Box& dst_box, float* dst, std::vector<float>* window) {
  std::optional<Box> region = Intersect(piece.box, dst_box);
  if (!region) return;
  int64_t window_begin = 0, window_end = 0;  // the source elements held in *window
  const int64_t src_numel = static_cast<int64_t>(piece.entry->numel);
  ForEachRun(*region, piece.box, dst_box, [&](int64_t src, int64_t at, int64_t count) {
    if (count >= kWindowFloats) {
      piece.file->ReadFloats(*piece.entry, src, count, dst + at);
      return;
    }
    if (src < window_begin || src + count > window_end) {
      window->resize(kWindowFloats);
      window_begin = src;
      window_end = std::min(src_numel, src + kWindowFloats);
      piece.file->ReadFloats(*piece.entry, window_begin, window_end - window_begin, window->data());
    }
    std::memcpy(dst + at, window->data() + (src - window_begin),
                static_cast<size_t>(count) * sizeof(float));
  });
}

std::string CoverageProblem(const std::string& name, const Box& target,
                            const std::vector<Piece>& pieces) {
  std::vector<Box> boxes;
  for (const Piece& p : pieces) boxes.push_back(p.box);
  Coverage c = CheckCoverage(target, boxes);
  switch (c.kind) {
    case Coverage::Kind::kExact:
      return "";
    case Coverage::Kind::kOverlap:
      return "tensor \"" + name + "\": " + FileOf(pieces[c.first]) + " and " +
             FileOf(pieces[c.second]) + " both hold " + BoxString(c.region);
    case Coverage::Kind::kGap:
      break;
  }
  return "tensor \"" + name + "\": " + BoxString(c.region) + " of " + BoxString(target) +
         " is in no shard" + (pieces.empty() ? " (no shard holds any of it)" : "");
}

}  // namespace loom::train
