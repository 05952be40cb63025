// The loom-train program as a function, so that tests can drive it in-process as well.
#ifndef LOOM_WORKER_TRAIN_RUN_H_
#define LOOM_WORKER_TRAIN_RUN_H_

#include <functional>
#include <string>
#include <vector>

namespace loom::train {

// Runs loom-train with `args` (argv without the program name) and the environment read through
// `getenv` (nullptr for unset). Returns the exit status: kExitOk, kExitBadInput (a one-line
// error on stderr naming the file or field) or kExitCrash.
int RunLoomTrain(const std::vector<std::string>& args,
                 const std::function<const char*(const char*)>& getenv);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_RUN_H_
