#include "worker/train/checkpoint/storage_check.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "worker/train/checkpoint/fs.h"
#include "worker/train/error.h"

namespace loom::train {
namespace {

// The longest relative name a checkpoint writes under its root:
// "/step-<19 digits>.gen-<19 digits>.partial/optimizer-pp000-tp000.safetensors.tmp".
constexpr size_t kLongestSuffix = 96;
constexpr size_t kProbeBytes = 4096;

std::string ErrnoText(int e) {
  return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")";
}

InputError StorageError(const std::string& what) { return BadInput("checkpoint.dir", what); }

std::string MiB(uint64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; }

void Probe(const std::string& root) {
  const std::string probe = root + "/.loom-probe-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw StorageError(root + " is not writable: creating a file there failed: " +
                       ErrnoText(errno) + "; point checkpoint.dir at a writable directory");
  }
  std::vector<char> bytes(kProbeBytes, 'x');
  const bool written = ::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(kProbeBytes);
  const int write_errno = errno;
  const bool synced = written && ::fsync(fd) == 0;
  const int sync_errno = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!written || !synced) {
    throw StorageError(
        root + ": writing a file there failed: " + ErrnoText(written ? sync_errno : write_errno) +
        "; free space or point checkpoint.dir elsewhere");
  }
}

}  // namespace

uint64_t CheckpointBytesEstimate(const ModelDims& d) {
  const uint64_t C = static_cast<uint64_t>(d.channels);
  const uint64_t params = static_cast<uint64_t>(d.vocab) * C +
                          static_cast<uint64_t>(d.max_seq_len) * C +
                          static_cast<uint64_t>(d.layers) * (12 * C * C + 13 * C) + 2 * C;
  return params * 12;
}

void CheckCheckpointStorage(const std::string& root, uint64_t bytes_needed) {
  if (root.size() + kLongestSuffix >= PATH_MAX) {
    throw StorageError("the path is " + std::to_string(root.size()) +
                       " characters; checkpoints under it would pass the system's limit of " +
                       std::to_string(PATH_MAX) + " (" + ErrnoText(ENAMETOOLONG) +
                       "); use a path of at most " + std::to_string(PATH_MAX - kLongestSuffix - 1) +
                       " characters");
  }
  try {
    MakeDirs(root);
  } catch (const IoError& e) {
    throw StorageError(std::string("cannot create the directory: ") + e.what());
  }
  Probe(root);
  struct statvfs fs {};
  if (::statvfs(root.c_str(), &fs) != 0) {
    throw StorageError(root + ": statvfs failed: " + ErrnoText(errno));
  }
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (free_bytes < bytes_needed) {
    throw StorageError(root + " has " + MiB(free_bytes) + " free but a checkpoint of this model " +
                       "needs about " + MiB(bytes_needed) + " (" + ErrnoText(ENOSPC) +
                       "); free space or point checkpoint.dir at a larger file system");
  }
}

}  // namespace loom::train
