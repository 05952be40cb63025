#include "worker/train/checkpoint/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "worker/train/error.h"

namespace loom::train {
namespace {

IoError SysError(const std::string& path, const std::string& what) {
  const int e = errno;
  return IoError(path + ": " + what + ": " + std::strerror(e) + " (errno " + std::to_string(e) +
                 ")");
}

}  // namespace

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

void FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw SysError(dir, "cannot open directory");
  int rc = ::fsync(fd);
  int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) throw SysError(dir, "fsync of directory failed");
}

void MakeDirs(const std::string& dir) {
  if (dir.empty() || dir == "." || dir == "/") return;
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) throw IoError(dir + ": exists and is not a directory");
    return;
  }
  MakeDirs(DirName(dir));
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    throw SysError(dir, "cannot create directory");
  }
}

void WriteFileAtomic(const std::string& path, const void* data, size_t size) {
  WriteFileAtomic(path, {{data, size}});
}

void WriteFileAtomic(const std::string& path,
                     const std::vector<std::pair<const void*, size_t>>& pieces) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw SysError(tmp, "cannot create");
  for (const auto& [data, size] : pieces) {
    const char* p = static_cast<const char*>(data);
    size_t left = size;
    while (left > 0) {
      ssize_t n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (n == 0) errno = EIO;
        IoError error = SysError(tmp, "write failed");
        ::close(fd);
        ::unlink(tmp.c_str());
        throw error;
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  if (::fsync(fd) != 0) {
    IoError error = SysError(tmp, "fsync failed");
    ::close(fd);
    ::unlink(tmp.c_str());
    throw error;
  }
  if (::close(fd) != 0) {
    IoError error = SysError(tmp, "close failed");
    ::unlink(tmp.c_str());
    throw error;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    IoError error = SysError(path, "rename failed");
    ::unlink(tmp.c_str());
    throw error;
  }
  FsyncDir(DirName(path));
}

}  // namespace loom::train
