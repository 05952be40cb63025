// Fuzz target: a checkpoint's manifest.json as the training core reads it when it resumes
// (worker/train/checkpoint/checkpoint.cc: ReadCheckpointMeta, FindLatestCheckpoint). The input
// is the manifest's text. Contract: a malformed manifest is an InputError naming the file (or,
// for FindLatestCheckpoint, a directory that is not a checkpoint), never a crash.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "tests/fuzz/fuzz_temp_dir.h"
#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string root = loom::fuzz::TempDir() + "/checkpoints";
  const std::string dir = root + "/step-000010";
  static const bool made = std::filesystem::create_directories(dir);
  (void)made;
  loom::fuzz::WriteFile(dir + "/manifest.json", data, size);
  try {
    loom::train::CheckpointMeta meta = loom::train::ReadCheckpointMeta(dir);
    (void)meta;
  } catch (const loom::train::InputError&) {
  }
  // Never throws: a directory whose manifest does not parse is not a checkpoint.
  (void)loom::train::FindLatestCheckpoint(root);
  return 0;
}
