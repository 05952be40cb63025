#include "worker/agent/write_all.h"

#include <unistd.h>

#include <cerrno>

namespace loom::worker {

int WriteAllAndClose(int fd, std::string_view content) {
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      ::close(fd);
      return err;
    }
    done += static_cast<size_t>(n);
  }
  return ::close(fd) != 0 ? errno : 0;
}

}  // namespace loom::worker
