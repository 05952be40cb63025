#include "server/doctor/telemetry_window.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace loom::doctor {
namespace {

double Phase(const v1::StepReport& r, const char* name) {
  auto it = r.phase_seconds().find(name);
  return it == r.phase_seconds().end() ? 0.0 : it->second;
}

}  // namespace

bool TelemetryWindow::Add(const v1::StepReport& report) {
  if (report.has_val_loss() || report.checkpoint()) return false;
  if (!std::isfinite(report.step_seconds()) || report.step_seconds() <= 0) return false;
  if (report.rank() < 0) return false;
  RankWindow& w = ranks_[report.rank()];
  if (report.step() <= w.last_step) return false;
  w.last_step = report.step();
  if (++w.accepted <= kWarmupSteps) return false;

  RankStep s;
  s.step = report.step();
  s.step_seconds = report.step_seconds();
  s.has_phases = !report.phase_seconds().empty();
  s.data = Phase(report, "data");
  s.forward = Phase(report, "forward");
  s.backward = Phase(report, "backward");
  s.optimizer = Phase(report, "optimizer");
  s.comm_exposed = Phase(report, "comm_exposed");
  s.bubble = Phase(report, "bubble");
  s.overlap_ratio = report.overlap_ratio();
  s.idle_ratio = report.idle_ratio();
  if (auto it = report.comm_bytes().find("all_reduce"); it != report.comm_bytes().end()) {
    s.dp_bytes = it->second;
  }
  s.memory_bytes = report.memory_bytes();
  s.reserved_bytes = report.reserved_memory_bytes();
  s.peak_bytes = report.peak_memory_bytes();
  s.fragmentation = report.memory_fragmentation();
  s.device_allocations = report.device_allocations();
  s.cuda = report.device().rfind("cuda", 0) == 0;
  w.steps.push_back(s);
  while (w.steps.size() > kMaxSteps) w.steps.pop_front();

  if (report.has_block_costs()) {
    const v1::BlockCosts& c = report.block_costs();
    BlockSample b;
    b.step = report.step();
    b.first_block = c.first_block();
    const int n = std::min(c.forward_seconds_size(), c.backward_seconds_size());
    for (int i = 0; i < n; ++i) b.seconds.push_back(c.forward_seconds(i) + c.backward_seconds(i));
    b.has_embedding = c.has_embedding();
    b.embedding = c.embedding_forward_seconds() + c.embedding_backward_seconds();
    b.has_head = c.has_head();
    b.head = c.head_forward_seconds() + c.head_backward_seconds();
    w.blocks.push_back(std::move(b));
    while (w.blocks.size() > kMaxBlockSamples) w.blocks.pop_front();
  }
  return true;
}

int64_t TelemetryWindow::newest_step() const {
  auto it = ranks_.find(0);
  return it == ranks_.end() ? -1 : it->second.last_step;
}

}  // namespace loom::doctor
