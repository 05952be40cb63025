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

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw BadInput(path, std::string("cannot open: ") + std::strerror(errno));
  // The destructor does not run when the constructor throws: close here on every error.
  struct CloseOnError {
    int fd;
    bool armed;
    ~CloseOnError() {
      if (armed) ::close(fd);
    }
  } guard{fd_, true};
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw BadInput(path, "cannot stat");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  file_size_ = file_size;

  unsigned char len_bytes[8];
  if (file_size < 8 || !PreadAll(fd_, len_bytes, 8, 0)) {
    throw BadInput(path, "too short for a safetensors file");
  }
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t{len_bytes[i]} << (8 * i);
  if (header_len > kMaxHeaderBytes || header_len > file_size - 8) {
    throw BadInput(path, "header length " + std::to_string(header_len) +
                             " does not fit the file (" + std::to_string(file_size) + " bytes)");
  }
  std::string json(header_len, '\0');
  if (!PreadAll(fd_, json.data(), header_len, 8)) throw BadInput(path, "cannot read the header");
  Value header = ParseJson(json, path);
  if (!header.is_object()) throw BadInput(path, "the header is not a JSON object");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;

  for (const auto& [name, entry] : header.members) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : entry.members) {
        if (v.kind == Value::Kind::kString) metadata_[k] = v.text;
      }
      continue;
    }
    if (!entry.is_object()) throw BadInput(path, "tensor \"" + name + "\": not an object");
    const Value* dtype = entry.Find("dtype");
    if (dtype == nullptr || dtype->text != "F32") {
      throw BadInput(path, "tensor \"" + name + "\": dtype " +
                               (dtype ? dtype->text : std::string("missing")) + ", expected F32");
    }
    const Value* shape_v = entry.Find("shape");
    if (shape_v == nullptr || shape_v->kind != Value::Kind::kArray) {
      throw BadInput(path, "tensor \"" + name + "\": shape missing");
    }
    Entry e;
    e.numel = 1;
    for (const Value& dim : shape_v->items) {
      uint64_t d = 0;
      // The bound keeps numel * 4 far from overflowing.
      if (!ToU64(dim, &d) || d > (uint64_t{1} << 40)) {
        throw BadInput(path, "tensor \"" + name + "\": bad shape");
      }
      e.shape.push_back(static_cast<int64_t>(d));
      e.numel *= d;
      if (e.numel > (uint64_t{1} << 40)) throw BadInput(path, "tensor \"" + name + "\": too big");
    }
    const Value* offsets = entry.Find("data_offsets");
    uint64_t begin = 0, end = 0;
    if (offsets == nullptr || offsets->kind != Value::Kind::kArray || offsets->items.size() != 2 ||
        !ToU64(offsets->items[0], &begin) || !ToU64(offsets->items[1], &end)) {
      throw BadInput(path, "tensor \"" + name + "\": bad data_offsets");
    }
    const uint64_t bytes = e.numel * sizeof(float);
    if (end < begin || end - begin != bytes || end > data_size) {
      throw BadInput(path, "tensor \"" + name + "\": data_offsets [" + std::to_string(begin) +
                               ", " + std::to_string(end) + "] do not fit " +
                               std::to_string(bytes) + " bytes inside the file (truncated?)");
    }
    e.data_offset = data_start + begin;
    tensors_.emplace_back(name, std::move(e));
  }
  guard.armed = false;  // success: the object owns the descriptor now
}

SafetensorsFile::~SafetensorsFile() { Close(); }

void SafetensorsFile::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void SafetensorsFile::Reopen() {
  if (fd_ >= 0) return;
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw BadInput(path_, std::string("cannot reopen: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != file_size_) {
    ::close(fd);
    throw BadInput(path_, "changed size while being read (replaced underneath?)");
  }
  fd_ = fd;
}

const SafetensorsFile::Entry* SafetensorsFile::Find(const std::string& name) const {
  for (const auto& [n, e] : tensors_) {
    if (n == name) return &e;
  }
  return nullptr;
}

void SafetensorsFile::ReadFloats(const Entry& entry, uint64_t first, uint64_t count,
                                 float* dst) const {
  LOOM_CHECK(fd_ >= 0 && first + count <= entry.numel,
             "SafetensorsFile::ReadFloats on a closed file or past the tensor's end");
  if (count == 0) return;
  if (!PreadAll(fd_, dst, count * sizeof(float), entry.data_offset + first * sizeof(float))) {
    throw BadInput(path_, "read failed (file changed underneath?)");
  }
}

std::map<std::string, std::string> ReadSafetensors(const std::string& path,
                                                   const std::vector<TensorToRead>& wanted) {
  SafetensorsFile file(path);
  for (const auto& [name, entry] : file.tensors()) {
    bool known = false;
    for (const TensorToRead& w : wanted) known |= (w.name == name);
    if (!known) throw BadInput(path, "unexpected tensor \"" + name + "\" (a different model?)");
  }
  for (const TensorToRead& w : wanted) {
    const SafetensorsFile::Entry* entry = file.Find(w.name);
    if (entry == nullptr) throw BadInput(path, "tensor \"" + w.name + "\" is missing");
    if (entry->shape != w.shape) {
      throw BadInput(path, "tensor \"" + w.name + "\" has shape " + ShapeString(entry->shape) +
                               ", the model expects " + ShapeString(w.shape));
    }
    file.ReadFloats(*entry, 0, entry->numel, w.data);
  }
  return file.metadata();
}

}  // namespace loom::train
