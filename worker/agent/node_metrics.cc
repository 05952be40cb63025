#include "worker/agent/node_metrics.h"

#include <utility>

namespace loom::worker {
namespace {

constexpr char kExitsName[] = "loom_worker_rank_exits_total";
constexpr char kExitsHelp[] = "Rank process exits on this node, by reason.";

// Counters only go up: add what the source counted since the last scrape.
void CatchUp(metrics::Counter& counter, int64_t total) {
  const double delta = static_cast<double>(total) - counter.Value();
  if (delta > 0) counter.Increment(delta);
}

}  // namespace

NodeMetrics::NodeMetrics(metrics::Registry* registry,
                         const std::vector<loom::v1::Device>& devices, Sources sources)
    : sources_(std::move(sources)),
      running_ranks_(registry->GetGauge("loom_node_running_ranks",
                                        "Rank processes alive on this node.")),
      launches_(registry->GetCounter("loom_worker_launches_total",
                                     "Rank processes launched by this worker.")),
      exits_success_(registry->GetCounter(kExitsName, kExitsHelp, {{"reason", "success"}})),
      exits_retryable_(registry->GetCounter(kExitsName, kExitsHelp, {{"reason", "retryable"}})),
      exits_permanent_(registry->GetCounter(kExitsName, kExitsHelp, {{"reason", "permanent"}})),
      exits_stopped_(registry->GetCounter(kExitsName, kExitsHelp, {{"reason", "stopped"}})),
      session_connected_(registry->GetGauge(
          "loom_worker_session_connected", "1 while the session stream to loomd is open.")) {
  int gpus = 0, cpus = 0;
  for (const loom::v1::Device& d : devices) {
    if (d.kind() == loom::v1::DEVICE_KIND_GPU) ++gpus;
    if (d.kind() == loom::v1::DEVICE_KIND_CPU) ++cpus;
  }
  constexpr char kDevicesHelp[] = "Devices this node advertises to loomd, by kind.";
  registry->GetGauge("loom_node_devices", kDevicesHelp, {{"kind", "gpu"}}).Set(gpus);
  registry->GetGauge("loom_node_devices", kDevicesHelp, {{"kind", "cpu"}}).Set(cpus);
  registry->AddCollectHook([this] { Collect(); });
}

void NodeMetrics::Collect() {
  if (sources_.supervisor) {
    const SupervisorStats s = sources_.supervisor();
    running_ranks_.Set(static_cast<double>(s.running_ranks));
    CatchUp(launches_, s.launches);
    CatchUp(exits_success_, s.exits_success);
    CatchUp(exits_retryable_, s.exits_retryable);
    CatchUp(exits_permanent_, s.exits_permanent);
    CatchUp(exits_stopped_, s.exits_stopped);
  }
  if (sources_.session_connected) session_connected_.Set(sources_.session_connected() ? 1 : 0);
}

}  // namespace loom::worker
