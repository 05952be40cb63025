#include "worker/train/error.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace loom::train {

void CrashAt(const char* file, int line, const std::string& message, int errno_value) {
  if (errno_value != 0) {
    std::fprintf(stderr, "%s:%d: %s: %s (errno %d)\n", file, line, message.c_str(),
                 std::strerror(errno_value), errno_value);
  } else {
    std::fprintf(stderr, "%s:%d: %s\n", file, line, message.c_str());
  }
  std::fflush(stderr);
  std::exit(kExitCrash);
}

}  // namespace loom::train
