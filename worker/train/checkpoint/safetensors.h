// safetensors files (the Hugging Face format): an 8-byte little-endian header length, a JSON
// header {"__metadata__": {...}, "<name>": {"dtype": "F32", "shape": [...],
// "data_offsets": [begin, end]}, ...}, then the raw little-endian tensor data (offsets relative
// to the end of the header). Only F32 tensors are written and read here.
#ifndef LOOM_WORKER_TRAIN_CHECKPOINT_SAFETENSORS_H_
#define LOOM_WORKER_TRAIN_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
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

// "[2, 64]", for messages.
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CHECKPOINT_SAFETENSORS_H_
