// LaunchPool: starts a gang's rank processes on several threads at once.
//
// Launch() returns only once its child has exec'd (launcher.h), and an exec costs a few hundred
// microseconds of the machine's time (mapping the program, the loader's start). One thread
// launching 8 ranks waits for 8 execs in a row while the other cores idle; the pool's threads
// wait for them side by side.
//
// Threading: LaunchAll() is called from one thread at a time (the supervisor's loop), which
// takes part in the launching. The pool's threads live until the destructor, and they must,
// because a rank's parent-death signal fires when the *thread* that started it exits: destroy
// the pool only after every rank launched through it has exited.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/agent/launcher.h"

namespace loom::worker {

class LaunchPool {
 public:
  // `threads` helpers besides the caller (0: the caller launches everything itself).
  explicit LaunchPool(int threads);
  ~LaunchPool();
  LaunchPool(const LaunchPool&) = delete;
  LaunchPool& operator=(const LaunchPool&) = delete;

  // Launches every request, in parallel, and returns their results in the requests' order. The
  // signal dispositions the children reset are read once per call (NonDefaultSignals()).
  std::vector<absl::StatusOr<LaunchedProcess>> LaunchAll(
      const std::vector<LaunchRequest>& requests);

 private:
  struct Task {
    const LaunchRequest* request;
    absl::StatusOr<LaunchedProcess>* result;
    const SignalSnapshot* signals;  // LaunchAll()'s, alive until its tasks are done
  };
  void Work();
  // Runs one queued task on `stack` (the calling thread's); false when it found none.
  bool RunOne(std::unique_lock<std::mutex>& lock, ChildStack& stack);

  std::mutex mu_;  // guards everything below
  std::condition_variable work_cv_, done_cv_;
  std::deque<Task> queue_;
  int pending_ = 0;  // tasks of the current LaunchAll() not yet finished
  bool stopping_ = false;
  ChildStack caller_stack_;  // LaunchAll()'s caller's (one thread at a time)
  std::vector<std::thread> threads_;
};

}  // namespace loom::worker
