// safetensors files (the Hugging Face format): an 8-byte little-endian header length, a JSON
// header {"__metadata__": {...}, "<name>": {"dtype": "F32", "shape": [...],
// "data_offsets": [begin, end]}, ...}, then the raw little-endian tensor data (offsets relative
// to the end of the header). Only F32 tensors are written and read here.
#ifndef LOOM_WORKER_TRAIN_CHECKPOINT_SAFETENSORS_H_
#define LOOM_WORKER_TRAIN_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace loom::train {

// A tensor to write: its name, shape, and prod(shape) floats at `data`.
struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  const float* data;
};

// A tensor to read: the file must hold `name` as F32 with exactly `shape`; its data lands in
// `data` (prod(shape) floats).
struct TensorToRead {
  std::string name;
  std::vector<int64_t> shape;
  float* data;
};

// Writes the tensors (in the order given) and string metadata durably (WriteFileAtomic).
// Throws IoError.
void WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                      const std::map<std::string, std::string>& metadata);

// Reads exactly the tensors of `wanted` from `path`. Anything else is an InputError naming the
// file (and the tensor): unreadable file, malformed header, a missing or extra tensor, a dtype
// other than F32, a shape different from the wanted one, data offsets outside the file.
// The wanted buffers may be partly written when it throws. Returns the metadata.
std::map<std::string, std::string> ReadSafetensors(const std::string& path,
                                                   const std::vector<TensorToRead>& wanted);

// An open safetensors file whose header has been read and checked: every tensor is F32 with a
// shape, and its data lies inside the file with exactly prod(shape) * 4 bytes. Reading tensor
// data is then a pread of any element range, so a caller can take just the part it needs.
// The descriptor can be closed once the header is read and reopened for the data, so that a
// checkpoint of thousands of shard files never holds more than a few open. Between Close and
// Reopen the object is immutable: ReadFloats may run on several threads at once (pread).
class SafetensorsFile {
 public:
  struct Entry {
    std::vector<int64_t> shape;
    uint64_t data_offset = 0;  // of the first byte, from the start of the file
    uint64_t numel = 0;
  };

  // Opens `path` and checks its header. Anything wrong is an InputError naming the file (and
  // the tensor): unreadable file, malformed header, a dtype other than F32, data offsets that
  // do not match the shape or lie outside the file ("truncated?").
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // The string values of __metadata__ (other kinds are dropped).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensors in header order.
  const std::vector<std::pair<std::string, Entry>>& tensors() const { return tensors_; }
  // The tensor named `name`, or nullptr.
  const Entry* Find(const std::string& name) const;

  // Reads elements [first, first + count) of `entry` (row-major) into `dst`. Requires an open
  // file and first + count <= entry.numel. Throws InputError naming the file when the read
  // comes short.
  void ReadFloats(const Entry& entry, uint64_t first, uint64_t count, float* dst) const;

  // Closes the descriptor (the header stays); Reopen opens the file again, checking that its
  // size is what it was (else InputError: replaced underneath). Both are no-ops when already
  // in that state.
  void Close();
  void Reopen();

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<std::pair<std::string, Entry>> tensors_;
};

// "[2, 64]", for messages.
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CHECKPOINT_SAFETENSORS_H_
