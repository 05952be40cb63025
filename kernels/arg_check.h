// Argument checks for the kernels: an impossible argument is a programming error in the caller,
// so it prints file:line and a message to stderr and exits the process with status 1. Kept free
// of any dependency beyond the C++ standard library (kernels/ builds with a compiler alone).
#ifndef LOOM_KERNELS_ARG_CHECK_H_
#define LOOM_KERNELS_ARG_CHECK_H_

#include <cstdio>
#include <cstdlib>

namespace loom::kernels::internal {

// Prints "file:line: kernel argument check failed: cond: message" and exits with status 1.
[[noreturn]] inline void ArgCheckFailed(const char* file, int line, const char* cond,
                                        const char* message) {
  std::fprintf(stderr, "%s:%d: kernel argument check failed: %s: %s\n", file, line, cond, message);
  std::fflush(stderr);
  std::exit(1);
}

}  // namespace loom::kernels::internal

// LOOM_KERNEL_CHECK(cond, message): if cond is false, report and exit (see above). Always on,
// also in release builds: the checks are O(1) per call, negligible beside the op itself.
#define LOOM_KERNEL_CHECK(cond, message)                                                        \
  do {                                                                                          \
    if (!(cond)) ::loom::kernels::internal::ArgCheckFailed(__FILE__, __LINE__, #cond, message); \
  } while (0)

#endif  // LOOM_KERNELS_ARG_CHECK_H_
