// Errors of the training core, in two kinds.
//
// InputError: the user's configuration or input is wrong (a spec field, a token file, a
// checkpoint that does not fit the model). The message names the file or field at fault and
// what was expected; loom-train prints it on one line and exits with kExitBadInput (2), which
// loomd treats as permanent (docs/rank-contract.md).
//
// LOOM_CHECK: an internal invariant or a failed system call. It prints file:line and the
// message and exits with kExitCrash (1), which loomd treats as retryable.
#ifndef LOOM_WORKER_TRAIN_ERROR_H_
#define LOOM_WORKER_TRAIN_ERROR_H_

#include <stdexcept>
#include <string>

namespace loom::train {

inline constexpr int kExitOk = 0;
inline constexpr int kExitCrash = 1;
inline constexpr int kExitBadInput = 2;
// Stopped on a stop request (SIGUSR2, diag/stop_request.h) after the gang saved a checkpoint at
// the step it agreed on: the worker asked for it, loomd re-queues the job from that checkpoint.
inline constexpr int kExitStopped = 75;

// Thrown for bad configuration or input; what() is the complete one-line message.
class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& message) : std::runtime_error(message) {}
};

// Thrown when the file system fails under us (disk full, I/O error) while writing; loom-train
// exits with kExitCrash, so loomd retries from the last complete checkpoint.
class IoError : public std::runtime_error {
 public:
  explicit IoError(const std::string& message) : std::runtime_error(message) {}
};

// Builds an InputError whose message is "<where>: <what>", e.g. "train.steps: expected > 0".
inline InputError BadInput(const std::string& where, const std::string& what) {
  return InputError(where + ": " + what);
}

// Prints "file:line: message" (plus strerror(errno) when errno_value != 0) on stderr and exits
// with kExitCrash. Never returns.
[[noreturn]] void CrashAt(const char* file, int line, const std::string& message,
                          int errno_value = 0);

}  // namespace loom::train

// Checks an internal invariant; on failure crashes with file:line and the message.
#define LOOM_CHECK(cond, message)                                       \
  do {                                                                  \
    if (!(cond)) ::loom::train::CrashAt(__FILE__, __LINE__, (message)); \
  } while (0)

// Checks a system call's result; on failure crashes with file:line, the message and errno.
#define LOOM_CHECK_SYS(cond, message)                                          \
  do {                                                                         \
    if (!(cond)) ::loom::train::CrashAt(__FILE__, __LINE__, (message), errno); \
  } while (0)

#endif  // LOOM_WORKER_TRAIN_ERROR_H_
