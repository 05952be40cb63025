#include "worker/agent/launch_pool.h"

namespace loom::worker {

LaunchPool::LaunchPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

LaunchPool::~LaunchPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

bool LaunchPool::RunOne(std::unique_lock<std::mutex>& lock, ChildStack& stack) {
  if (queue_.empty()) return false;
  const Task task = queue_.front();
  queue_.pop_front();
  lock.unlock();
  *task.result = Launch(*task.request, &stack, task.signals);
  lock.lock();
  if (--pending_ == 0) done_cv_.notify_all();
  return true;
}

void LaunchPool::Work() {
  ChildStack stack;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    RunOne(lock, stack);
  }
}

std::vector<absl::StatusOr<LaunchedProcess>> LaunchPool::LaunchAll(
    const std::vector<LaunchRequest>& requests) {
  std::vector<absl::StatusOr<LaunchedProcess>> results(requests.size(),
                                                       absl::InternalError("not launched"));
  const SignalSnapshot signals = NonDefaultSignals();
  std::unique_lock<std::mutex> lock(mu_);
  for (size_t i = 0; i < requests.size(); ++i) {
    queue_.push_back(Task{&requests[i], &results[i], &signals});
  }
  pending_ += static_cast<int>(requests.size());
  work_cv_.notify_all();
  while (RunOne(lock, caller_stack_)) {
  }
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  return results;
}

}  // namespace loom::worker
