// StreamLimiter: a bound on the server streams (WatchJob, StreamJobLogs), or on the slow calls
// (GetJobTrace), one caller may hold open at once, so that one client (a dashboard gone wrong, a
// leaking script) cannot take all of loomd's memory and file descriptors. Callers are counted by
// principal subject (the tenant, or the node/admin name), whatever connection they use.
//
// Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace loom::rpc {

inline constexpr int kDefaultMaxStreamsPerClient = 10'000;
// GetJobTrace calls one caller may have in flight: each holds one of loomd's few trace slots
// (TraceCollector::kMaxOpen) for up to its wait, so one caller must not hold them all.
inline constexpr int kMaxTracesPerClient = 4;

class StreamLimiter;

// One open stream; releases its place when destroyed.
class StreamSlot {
 public:
  StreamSlot(StreamLimiter* limiter, std::string subject)
      : limiter_(limiter), subject_(std::move(subject)) {}
  ~StreamSlot();
  StreamSlot(const StreamSlot&) = delete;
  StreamSlot& operator=(const StreamSlot&) = delete;

 private:
  StreamLimiter* const limiter_;
  const std::string subject_;
};

class StreamLimiter {
 public:
  // `max_per_client` >= 1. `what` names what is counted and `way_out` what a refused caller
  // can do, for the refusal's message; the defaults are the server streams'.
  explicit StreamLimiter(int max_per_client,
                         std::string what = "open WatchJob/StreamJobLogs streams",
                         std::string way_out =
                             "close streams it no longer reads, or raise "
                             "loomd's --max-streams-per-client")
      : max_per_client_(max_per_client), what_(std::move(what)), way_out_(std::move(way_out)) {}

  // A slot for one more stream of `subject`, or RESOURCE_EXHAUSTED naming the limit and the
  // way out when `subject` already holds max_per_client streams. The limiter must outlive it.
  absl::StatusOr<std::unique_ptr<StreamSlot>> Acquire(const std::string& subject);

  int open(const std::string& subject);  // for tests and metrics

 private:
  friend class StreamSlot;
  void Release(const std::string& subject);

  const int max_per_client_;
  const std::string what_, way_out_;
  absl::Mutex mu_;
  std::map<std::string, int> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::rpc
