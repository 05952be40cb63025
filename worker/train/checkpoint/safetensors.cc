#include "worker/train/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <utility>

#include "worker/train/checkpoint/fs.h"
#include "worker/train/config/json.h"
#include "worker/train/error.h"

namespace loom::train {

static_assert(std::endian::native == std::endian::little,
              "safetensors and llm.c files are little-endian; this code writes memory as is");

namespace {

// A header larger than this is refused (the format's reference reader uses the same bound).
constexpr uint64_t kMaxHeaderBytes = 100 * 1000 * 1000;

size_t Numel(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t s : shape) n *= static_cast<size_t>(s);
  return n;
}

// Parses a non-negative integer JSON number.
bool ToU64(const Value& v, uint64_t* out) {
  if (v.kind != Value::Kind::kNumber) return false;
  auto [ptr, ec] = std::from_chars(v.text.data(), v.text.data() + v.text.size(), *out);
  return ec == std::errc() && ptr == v.text.data() + v.text.size();
}

// Reads exactly `size` bytes at `offset`; false on a short read or error.
bool PreadAll(int fd, void* dst, size_t size, uint64_t offset) {
  char* p = static_cast<char*>(dst);
  while (size > 0) {
    ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

}  // namespace

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  JsonObject meta;
  for (const auto& [k, v] : metadata) meta.Add(k, v);
  JsonObject header;
  header.AddRaw("__metadata__", meta.str());
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const uint64_t bytes = Numel(t.shape) * sizeof(float);
    std::string shape = "[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      shape += (i ? "," : "") + std::to_string(t.shape[i]);
    }
    shape += "]";
    JsonObject entry;
    entry.Add("dtype", "F32");
    entry.AddRaw("shape", shape);
    entry.AddRaw("data_offsets",
                 "[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]");
    header.AddRaw(t.name, entry.str());
    offset += bytes;
  }
  std::string json = header.str();
  json.append((8 - json.size() % 8) % 8, ' ');  // pad so the data starts 8-byte aligned
  const uint64_t header_len = json.size();
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(header_len >> (8 * i));

  std::vector<std::pair<const void*, size_t>> pieces;
  pieces.emplace_back(len_bytes, 8);
  pieces.emplace_back(json.data(), json.size());
  for (const TensorToWrite& t : tensors) {
    pieces.emplace_back(t.data, Numel(t.shape) * sizeof(float));
  }
  WriteFileAtomic(path, pieces);
}

std::map<std::string, std::string> ReadSafetensors(const std::string& path,
                                                   const std::vector<TensorToRead>& wanted) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw BadInput(path, std::string("cannot open: ") + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw BadInput(path, "cannot stat");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);

  unsigned char len_bytes[8];
  if (file_size < 8 || !PreadAll(fd, len_bytes, 8, 0)) {
    throw BadInput(path, "too short for a safetensors file");
  }
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t{len_bytes[i]} << (8 * i);
  if (header_len > kMaxHeaderBytes || header_len > file_size - 8) {
    throw BadInput(path, "header length " + std::to_string(header_len) +
                             " does not fit the file (" + std::to_string(file_size) + " bytes)");
  }
  std::string json(header_len, '\0');
  if (!PreadAll(fd, json.data(), header_len, 8)) throw BadInput(path, "cannot read the header");
  Value header = ParseJson(json, path);
  if (!header.is_object()) throw BadInput(path, "the header is not a JSON object");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;

  std::map<std::string, std::string> metadata;
  if (const Value* meta = header.Find("__metadata__")) {
    for (const auto& [k, v] : meta->members) {
      if (v.kind == Value::Kind::kString) metadata[k] = v.text;
    }
  }
  for (const auto& [name, entry] : header.members) {
    if (name == "__metadata__") continue;
    bool known = false;
    for (const TensorToRead& w : wanted) known |= (w.name == name);
    if (!known) throw BadInput(path, "unexpected tensor \"" + name + "\" (a different model?)");
  }
  for (const TensorToRead& w : wanted) {
    const Value* entry = header.Find(w.name);
    if (entry == nullptr || !entry->is_object()) {
      throw BadInput(path, "tensor \"" + w.name + "\" is missing");
    }
    const Value* dtype = entry->Find("dtype");
    if (dtype == nullptr || dtype->text != "F32") {
      throw BadInput(path, "tensor \"" + w.name + "\": dtype " +
                               (dtype ? dtype->text : std::string("missing")) + ", expected F32");
    }
    const Value* shape_v = entry->Find("shape");
    std::vector<int64_t> shape;
    if (shape_v == nullptr || shape_v->kind != Value::Kind::kArray) {
      throw BadInput(path, "tensor \"" + w.name + "\": shape missing");
    }
    for (const Value& dim : shape_v->items) {
      uint64_t d = 0;
      if (!ToU64(dim, &d)) throw BadInput(path, "tensor \"" + w.name + "\": bad shape");
      shape.push_back(static_cast<int64_t>(d));
    }
    if (shape != w.shape) {
      throw BadInput(path, "tensor \"" + w.name + "\" has shape " + ShapeString(shape) +
                               ", the model expects " + ShapeString(w.shape));
    }
    const Value* offsets = entry->Find("data_offsets");
    uint64_t begin = 0, end = 0;
    if (offsets == nullptr || offsets->kind != Value::Kind::kArray || offsets->items.size() != 2 ||
        !ToU64(offsets->items[0], &begin) || !ToU64(offsets->items[1], &end)) {
      throw BadInput(path, "tensor \"" + w.name + "\": bad data_offsets");
    }
    const uint64_t bytes = Numel(w.shape) * sizeof(float);
    if (end < begin || end - begin != bytes || end > data_size) {
      throw BadInput(path, "tensor \"" + w.name + "\": data_offsets [" + std::to_string(begin) +
                               ", " + std::to_string(end) + "] do not fit " +
                               std::to_string(bytes) + " bytes inside the file (truncated?)");
    }
    if (!PreadAll(fd, w.data, bytes, data_start + begin)) {
      throw BadInput(path, "tensor \"" + w.name + "\": read failed");
    }
  }
  return metadata;
}

}  // namespace loom::train
