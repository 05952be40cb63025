// JobWatchers: fan-out of job updates to WatchJob subscribers.
//
// Each subscriber owns a bounded queue. Publishing never blocks on a subscriber: a progress-only
// update replaces a progress-only update still waiting at the tail (a slow reader sees the
// latest progress, not every step), and when the queue is full the oldest entries are dropped
// (the reader still gets the newest state). A subscription closes after it has been given a
// terminal job, when the job manager shuts down, or when the reader drops it.
//
// Threading: thread-safe. The job manager publishes while holding its own lock; lock order is
// manager -> JobWatchers::mu_ -> JobSubscription::mu_, and a reader blocked in Next() holds
// only its subscription's lock.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "loom/v1/job.pb.h"

namespace loom::jobs {

inline constexpr size_t kMaxQueuedUpdates = 256;

class JobSubscription {
 public:
  JobSubscription() = default;
  JobSubscription(const JobSubscription&) = delete;
  JobSubscription& operator=(const JobSubscription&) = delete;

  // The next update, waiting up to `timeout`; nullopt when none came in time or the
  // subscription is closed and drained (then closed() is true).
  std::optional<v1::Job> Next(absl::Duration timeout);
  // The next update if one is queued, without waiting (for readers driven by the listener).
  std::optional<v1::Job> TryNext();
  bool closed() const;

  // Calls `listener` (empty: none) after each update is queued and when the subscription
  // closes, so that a reader need not hold a thread blocked in Next(). Called without this
  // subscription's lock but possibly under the job manager's lock: it must be quick and must
  // not call into the job manager. A listener call that already started may still run after
  // SetListener() returns.
  void SetListener(std::function<void()> listener);

 private:
  friend class JobWatchers;
  struct Update {
    v1::Job job;
    bool state_change = false;
  };
  void Push(const v1::Job& job, bool state_change);
  void Close();

  mutable absl::Mutex mu_;
  std::deque<Update> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> listener_ ABSL_GUARDED_BY(mu_);
};

class JobWatchers {
 public:
  JobWatchers() = default;
  JobWatchers(const JobWatchers&) = delete;
  JobWatchers& operator=(const JobWatchers&) = delete;

  // A subscription to `current.name()` whose first update is `current`. The caller must hold
  // whatever lock orders `current` before later Publish() calls (the manager's lock), so that
  // no update is lost between the snapshot and the subscription. A terminal `current` gives a
  // subscription that is already closed after that one update.
  std::shared_ptr<JobSubscription> Subscribe(const v1::Job& current);

  // Sends `job` to every live subscriber of job.name(); `state_change` false marks a
  // progress-only update (coalesced). Subscribers of a terminal job are closed after it.
  void Publish(const v1::Job& job, bool state_change);

  // Closes every subscription (server shutdown).
  void CloseAll();

  // Live subscriptions (for tests).
  size_t SubscriberCount();

 private:
  absl::Mutex mu_;
  std::map<std::string, std::vector<std::weak_ptr<JobSubscription>>> subscribers_
      ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace loom::jobs
