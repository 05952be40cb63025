// Fuzz target: safetensors files as the training core reads them for a checkpoint
// (worker/train/checkpoint/safetensors.cc). The input is the whole file. Contract: a file that
// is not a valid F32 safetensors file is an InputError naming it, never a crash, an
// out-of-bounds read or an allocation the file's size does not justify; once the header is
// accepted, every element of every tensor can be read.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_temp_dir.h"
#include "worker/train/checkpoint/safetensors.h"
#include "worker/train/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = loom::fuzz::TempDir() + "/model.safetensors";
  loom::fuzz::WriteFile(path, data, size);
  try {
    loom::train::SafetensorsFile file(path);
    std::vector<float> buffer;
    for (const auto& [name, entry] : file.tensors()) {
      // The header was checked against the file's size, so numel * 4 <= size.
      if (entry.numel > size / 4) __builtin_trap();
      buffer.resize(entry.numel);
      file.ReadFloats(entry, 0, entry.numel, buffer.data());
      if (file.Find(name) == nullptr) __builtin_trap();
    }
    file.Close();
    file.Reopen();
    // The reader that fills wanted buffers: ask for the first tensor as the file declares it.
    if (!file.tensors().empty()) {
      const auto& [name, entry] = file.tensors().front();
      buffer.assign(entry.numel, 0.0f);
      loom::train::ReadSafetensors(path, {{name, entry.shape, buffer.data()}});
    }
  } catch (const loom::train::InputError&) {
    // The documented outcome for a bad file.
  }
  return 0;
}
