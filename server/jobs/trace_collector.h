// TraceCollector: loomd's side of a job timeline request in flight (GetJobTrace). The job
// manager opens a request naming the nodes it asked and the ranks each one holds, the session
// handlers feed it the workers' TraceChunks, and the caller waits (a bounded time) until every
// node sent its last chunk.
//
// Bounds: a chunk is taken only from a node the request asked, for a rank that node holds (or
// rank -1 on a last chunk), and at most `max_events` events per request are kept (then
// `truncated`); chunks of unknown or finished requests are dropped. At most kMaxOpen requests
// are in flight at once.
//
// Time: waits use the real clock (absl::Now), not the manager's injected one: they bound how
// long an RPC handler thread blocks.
//
// Threading: thread-safe; its own mutex, never held while calling out. The job manager may
// call Open and Accept under its own lock (lock order: manager, then collector).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "loom/v1/trace.pb.h"

namespace loom::jobs {

class TraceCollector {
 public:
  static constexpr size_t kMaxOpen = 16;

  struct Result {
    std::map<int, std::vector<v1::TraceEvent>> events;  // by rank, for every rank that answered
    std::set<std::string> answered;                     // nodes whose last chunk came
    std::vector<std::string> notes;                     // the workers' notes, "nodes/N: ..."
    bool truncated = false;
  };

  // A new request expecting the ranks of each node in `ranks_by_node`. RESOURCE_EXHAUSTED when
  // kMaxOpen requests are in flight.
  absl::StatusOr<uint64_t> Open(std::map<std::string, std::set<int>> ranks_by_node,
                                size_t max_events);
  // A chunk from `node` (any request; see the bounds above).
  void Accept(const std::string& node, const v1::TraceChunk& chunk);
  // Waits until every node answered or `deadline`, then forgets the request and returns what
  // came. An unknown id returns an empty result.
  Result Wait(uint64_t id, absl::Time deadline);

 private:
  struct Pending {
    std::map<std::string, std::set<int>> ranks_by_node;
    size_t max_events = 0;
    size_t events = 0;
    Result result;
  };

  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::jobs
