// Durable file writes: a file appears under its final name complete or not at all.
#ifndef LOOM_WORKER_TRAIN_CHECKPOINT_FS_H_
#define LOOM_WORKER_TRAIN_CHECKPOINT_FS_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace loom::train {

// Writes `size` bytes to `path` durably: to "<path>.tmp" first, fsync, rename over `path`, then
// fsync the containing directory. On any failure the temporary file is removed, `path` keeps
// its previous content (if any), and IoError is thrown naming the file and the system error.
void WriteFileAtomic(const std::string& path, const void* data, size_t size);

// The same for a file made of consecutive pieces (pointer, bytes), written without joining them.
void WriteFileAtomic(const std::string& path,
                     const std::vector<std::pair<const void*, size_t>>& pieces);

// fsyncs a directory so that renames and creations inside it survive a crash. Throws IoError.
void FsyncDir(const std::string& dir);

// Creates `dir` and its missing parents (like mkdir -p). Throws IoError.
void MakeDirs(const std::string& dir);

// The directory part of `path` ("." when it has none).
std::string DirName(const std::string& path);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CHECKPOINT_FS_H_
