#include "worker/train/diag/fence.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "worker/train/error.h"

namespace loom::train {
namespace {

long ParseEnvInt(const char* name, const char* text, long min) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < min) {
    throw BadInput(name, std::string("expected an integer >= ") + std::to_string(min) + ", got '" +
                             text + "'");
  }
  return v;
}

void Watch(int fd, std::chrono::milliseconds timeout, const FenceAction& on_fenced) {
  using Clock = std::chrono::steady_clock;
  Clock::time_point last = Clock::now();
  std::string why;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(last + timeout - Clock::now());
    if (left.count() <= 0) {
      why = "no word from loom-worker for " + std::to_string(timeout.count()) +
            " ms (it is frozen or gone)";
      break;
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;  // the loop re-checks the time
    char buf[256];
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      last = Clock::now();
      continue;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    why = "loom-worker closed its end of the fence (it is gone)";
    break;
  }
  ::close(fd);
  on_fenced(why);
}

}  // namespace

void StartFenceWatch(int fd, std::chrono::milliseconds timeout, FenceAction on_fenced) {
  if (!on_fenced) {
    on_fenced = [](const std::string& why) {
      std::fprintf(stderr, "loom-train: stopping (self-fencing): %s\n", why.c_str());
      std::fflush(stderr);
      std::_Exit(kExitCrash);
    };
  }
  std::thread(Watch, fd, timeout, std::move(on_fenced)).detach();
}

void StartFenceWatchFromEnv(const std::function<const char*(const char*)>& getenv) {
  const char* fd_text = getenv("LOOM_FENCE_FD");
  if (fd_text == nullptr || *fd_text == '\0') return;
  const long fd = ParseEnvInt("LOOM_FENCE_FD", fd_text, 0);
  const char* timeout_text = getenv("LOOM_FENCE_TIMEOUT_MS");
  const long timeout_ms = timeout_text == nullptr || *timeout_text == '\0'
                              ? 30000
                              : ParseEnvInt("LOOM_FENCE_TIMEOUT_MS", timeout_text, 1);
  StartFenceWatch(static_cast<int>(fd), std::chrono::milliseconds(timeout_ms));
}

}  // namespace loom::train
