// Self-fencing: a rank whose loom-worker is frozen (SIGSTOP, a hung kernel call) or gone stops
// itself, so that it never trains unsupervised beside the gang loomd has restarted elsewhere.
// The worker writes a byte on the rank's fence (LOOM_FENCE_FD, a Unix socket) about every
// second (docs/rank-contract.md); a thread of the rank waits on it and, after
// LOOM_FENCE_TIMEOUT_MS without a byte or when the worker's end closes, fences the rank. (A
// worker killed outright also takes its ranks with it through PR_SET_PDEATHSIG.)
#ifndef LOOM_WORKER_TRAIN_DIAG_FENCE_H_
#define LOOM_WORKER_TRAIN_DIAG_FENCE_H_

#include <chrono>
#include <functional>
#include <string>

namespace loom::train {

// Called once, on the watch thread, with why; the default prints it and exits with kExitCrash.
using FenceAction = std::function<void(const std::string& why)>;

// Watches `fd` on a detached thread (see above). The thread owns nothing but `fd`, which it
// closes when it fences.
void StartFenceWatch(int fd, std::chrono::milliseconds timeout, FenceAction on_fenced = {});

// StartFenceWatch from the rank environment (LOOM_FENCE_FD, LOOM_FENCE_TIMEOUT_MS); nothing when
// LOOM_FENCE_FD is unset (loom-train run alone). Bad values are an InputError naming the
// variable.
void StartFenceWatchFromEnv(const std::function<const char*(const char*)>& getenv);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_DIAG_FENCE_H_
