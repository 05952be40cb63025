#include "server/jobs/job_watchers.h"

#include <utility>

#include "server/jobs/job_state_machine.h"

namespace loom::jobs {

std::optional<v1::Job> JobSubscription::Next(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || closed_; };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (queue_.empty()) return std::nullopt;
  v1::Job job = std::move(queue_.front().job);
  queue_.pop_front();
  return job;
}

std::optional<v1::Job> JobSubscription::TryNext() {
  absl::MutexLock lock(&mu_);
  if (queue_.empty()) return std::nullopt;
  v1::Job job = std::move(queue_.front().job);
  queue_.pop_front();
  return job;
}

void JobSubscription::SetListener(std::function<void()> listener) {
  absl::MutexLock lock(&mu_);
  listener_ = std::move(listener);
}

bool JobSubscription::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_ && queue_.empty();
}

void JobSubscription::Push(const v1::Job& job, bool state_change) {
  std::function<void()> listener;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    listener = listener_;
    if (!state_change && !queue_.empty() && !queue_.back().state_change) {
      queue_.back().job = job;  // coalesce progress
    } else {
      queue_.push_back({job, state_change});
      while (queue_.size() > kMaxQueuedUpdates) queue_.pop_front();
    }
  }
  if (listener) listener();
}

void JobSubscription::Close() {
  std::function<void()> listener;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    listener = listener_;
  }
  if (listener) listener();
}

std::shared_ptr<JobSubscription> JobWatchers::Subscribe(const v1::Job& current) {
  auto subscription = std::make_shared<JobSubscription>();
  subscription->Push(current, /*state_change=*/true);
  absl::MutexLock lock(&mu_);
  if (closed_ || IsTerminal(current.state())) {
    subscription->Close();
    return subscription;
  }
  auto& list = subscribers_[current.name()];
  std::erase_if(list, [](const std::weak_ptr<JobSubscription>& w) { return w.expired(); });
  list.push_back(subscription);
  return subscription;
}

void JobWatchers::Publish(const v1::Job& job, bool state_change) {
  absl::MutexLock lock(&mu_);
  auto it = subscribers_.find(job.name());
  if (it == subscribers_.end()) return;
  const bool terminal = IsTerminal(job.state());
  for (const std::weak_ptr<JobSubscription>& weak : it->second) {
    if (std::shared_ptr<JobSubscription> subscription = weak.lock()) {
      subscription->Push(job, state_change);
      if (terminal) subscription->Close();
    }
  }
  if (terminal) {
    subscribers_.erase(it);
  } else {
    std::erase_if(it->second, [](const std::weak_ptr<JobSubscription>& w) { return w.expired(); });
    if (it->second.empty()) subscribers_.erase(it);
  }
}

void JobWatchers::CloseAll() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  for (auto& [name, list] : subscribers_) {
    for (const std::weak_ptr<JobSubscription>& weak : list) {
      if (std::shared_ptr<JobSubscription> subscription = weak.lock()) subscription->Close();
    }
  }
  subscribers_.clear();
}

size_t JobWatchers::SubscriberCount() {
  absl::MutexLock lock(&mu_);
  size_t count = 0;
  for (auto& [name, list] : subscribers_) {
    for (const std::weak_ptr<JobSubscription>& weak : list) count += weak.expired() ? 0 : 1;
  }
  return count;
}

}  // namespace loom::jobs
