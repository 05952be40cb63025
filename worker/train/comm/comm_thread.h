// The communication thread of a communicator: runs queued operations one at a time, in the
// order they were queued, and completes (or fails) each one's Work. Issuing collectives in one
// order on every rank and executing them in that order is what keeps the ranks matched.
#ifndef LOOM_WORKER_TRAIN_COMM_COMM_THREAD_H_
#define LOOM_WORKER_TRAIN_COMM_COMM_THREAD_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "worker/train/comm/communicator.h"

namespace loom::train {

class CommThread {
 public:
  // `abort_on_failure`: the first operation that fails also aborts the thread with its message,
  // so every queued and later operation fails at once ("aborted: <first failure>") instead of
  // running on a transport whose peers are gone or out of step (collectives are matched by
  // order across ranks: after one fails on any rank, none later can match).
  explicit CommThread(bool abort_on_failure = false);
  // Fails what is still queued ("communicator destroyed"), then joins the thread: a running
  // operation finishes or times out first.
  ~CommThread();

  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `run` and returns its Work. `run` executes on the thread; an exception it throws
  // fails the Work with "<what>: <exception message>". Thread-safe.
  WorkHandle Enqueue(std::string what, std::function<void()> run);

  // Fails every queued and the running Work with "aborted: <why>" and refuses new ones
  // (they come back failed). `interrupt`, when set, runs under the lock to unblock the running
  // operation (e.g. UnboundBuffer::abortWaitRecv). Thread-safe; idempotent.
  void Abort(const std::string& why);
  // Registers how to interrupt the operation now running (cleared when it ends); called from
  // inside `run`.
  void SetInterrupt(std::function<void()> interrupt);

  bool aborted() const;

 private:
  struct Item {
    std::string what;
    std::function<void()> run;
    WorkHandle work;
  };
  void Loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  WorkHandle running_;
  std::function<void()> interrupt_;
  std::string aborted_;  // non-empty once aborted
  bool stop_ = false;
  const bool abort_on_failure_;
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_COMM_COMM_THREAD_H_
