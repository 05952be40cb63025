// NodeMetrics: the worker's Prometheus series, served on --metrics-listen /metrics.
//   loom_node_devices{kind="gpu|cpu"}            gauge    devices advertised to loomd
//   loom_node_running_ranks                       gauge    rank processes alive now
//   loom_worker_launches_total                    counter  rank processes started
//   loom_worker_rank_exits_total{reason=...}      counter  rank exits: success|retryable|
//                                                          permanent|stopped
//   loom_worker_session_connected                 gauge    1 while the Session stream is open
// The values live in their owners (Supervisor, SessionClient); a collect hook copies them at each
// scrape, so neither owner depends on the metrics library.
//
// Threading: the hook runs on the scraping thread and reads the sources' thread-safe accessors.
#pragma once

#include <functional>
#include <vector>

#include "common/metrics.h"
#include "loom/v1/node.pb.h"
#include "worker/agent/supervisor.h"

namespace loom::worker {

class NodeMetrics {
 public:
  struct Sources {
    std::function<SupervisorStats()> supervisor;  // may be empty in tests
    std::function<bool()> session_connected;      // may be empty in tests
  };

  // Registers the series in `registry` (which must outlive this object) and a collect hook that
  // refreshes them from `sources`.
  NodeMetrics(metrics::Registry* registry, const std::vector<loom::v1::Device>& devices,
              Sources sources);

 private:
  void Collect();

  Sources sources_;
  metrics::Gauge& running_ranks_;
  metrics::Counter& launches_;
  metrics::Counter& exits_success_;
  metrics::Counter& exits_retryable_;
  metrics::Counter& exits_permanent_;
  metrics::Counter& exits_stopped_;
  metrics::Gauge& session_connected_;
};

}  // namespace loom::worker
