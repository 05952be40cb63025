// The JobManager's timelines (GetJobTrace, `loomctl trace`): the ranks' trace rings are read on
// demand. loomd sends a TraceRequest to every node of the running gang, naming the ranks each
// holds, the workers answer with bounded TraceChunks (TraceCollector), and the answer comes back
// once every node sent its last chunk or trace_wait passed: a node that did not answer is named
// in missing_nodes and the others are returned.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/jobs/job_manager.h"

namespace loom::jobs {

absl::Status ValidateTraceSteps(int64_t first_step, int64_t last_step) {
  if (first_step == 0 && last_step == 0) return absl::OkStatus();  // the latest steps
  if (first_step < 1) {
    return absl::InvalidArgumentError(absl::StrCat("first_step must be >= 1 (got ", first_step,
                                                   "); steps count from 1 (loomctl: --steps A:B)"));
  }
  if (last_step < first_step) {
    return absl::InvalidArgumentError(absl::StrCat("last_step (", last_step,
                                                   ") must be >= first_step (", first_step,
                                                   "); give the range as A:B with A <= B"));
  }
  if (last_step - first_step + 1 > JobManager::kMaxTraceSteps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the step range ", first_step, ":", last_step, " spans ", last_step - first_step + 1,
        " steps; at most ", JobManager::kMaxTraceSteps, " at once (ask for a shorter range)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::JobTrace> JobManager::GetJobTrace(const v1::GetJobTraceRequest& request) {
  if (absl::StatusOr<std::string> id = ParseJobName(request.name()); !id.ok()) return id.status();
  if (absl::Status s = ValidateTraceSteps(request.first_step(), request.last_step()); !s.ok()) {
    return s;
  }
  v1::JobTrace trace;
  trace.set_name(request.name());
  std::map<std::string, std::set<int>> ranks_by_node;
  uint64_t request_id = 0;
  int tensor = 1, data = 1;
  {
    absl::MutexLock lock(&mu_);
    auto it = active_.find(request.name());
    if (it == active_.end()) {
      absl::StatusOr<v1::Job> stored = LoadJobLocked(request.name());
      if (!stored.ok()) return stored.status();
      return absl::FailedPreconditionError(
          absl::StrCat(request.name(), " is ", v1::JobState_Name(stored->state()),
                       ": a timeline is read from the ranks of a RUNNING job"));
    }
    ActiveJob& active = *it->second;
    if (active.job.state() != v1::RUNNING) {
      return absl::FailedPreconditionError(
          absl::StrCat(request.name(), " is ", v1::JobState_Name(active.job.state()),
                       ": a timeline is read from the ranks of a RUNNING job; try again once it "
                       "runs"));
    }
    int64_t first = request.first_step(), last = request.last_step();
    if (first == 0 && last == 0) {
      auto rank0 = active.latest_steps.find(0);
      if (rank0 == active.latest_steps.end() || rank0->second.step() < 1) {
        return absl::FailedPreconditionError(
            absl::StrCat(request.name(),
                         " has reported no step yet; try again in a moment, or "
                         "give the steps (--steps A:B)"));
      }
      last = rank0->second.step();
      first = std::max<int64_t>(1, last - kDefaultTraceSteps + 1);
    }
    trace.set_generation(active.job.generation());
    trace.set_first_step(first);
    trace.set_last_step(last);
    tensor = std::max(1, active.job.layout().tensor());
    data = std::max(1, active.job.layout().data());
    for (const v1::Placement& p : active.job.placements()) {
      for (int rank : p.ranks()) ranks_by_node[p.node()].insert(rank);
    }
    absl::StatusOr<uint64_t> opened = traces_.Open(ranks_by_node, kMaxTraceEvents);
    if (!opened.ok()) return opened.status();
    request_id = *opened;
    for (const auto& [node, ranks] : ranks_by_node) {
      v1::CoordinatorMessage message;
      v1::TraceRequest* r = message.mutable_trace_request();
      r->set_request_id(request_id);
      r->set_job(request.name());
      r->set_generation(trace.generation());
      r->set_first_step(first);
      r->set_last_step(last);
      for (int rank : ranks) r->add_ranks(rank);
      nodes_.Send(node, message);  // a node without a session does not answer: missing
    }
  }
  TraceCollector::Result got = traces_.Wait(request_id, absl::Now() + options_.trace_wait);
  std::map<int, std::string> node_of;
  for (const auto& [node, ranks] : ranks_by_node) {
    if (!got.answered.contains(node)) {
      trace.add_missing_nodes(node);
      continue;
    }
    for (int rank : ranks) node_of[rank] = node;
  }
  for (const auto& [rank, node] : node_of) {
    v1::RankTrace* r = trace.add_ranks();
    r->set_rank(rank);
    r->set_node(node);
    // Rank order puts tensor fastest, then data, then pipeline.
    r->set_tensor(rank % tensor);
    r->set_data((rank / tensor) % data);
    r->set_stage(rank / (tensor * data));
    auto events = got.events.find(rank);
    if (events == got.events.end()) continue;
    for (v1::TraceEvent& e : events->second) *r->add_events() = std::move(e);
  }
  for (std::string& n : got.notes) trace.add_notes(std::move(n));
  trace.set_truncated(got.truncated);
  if (got.truncated) {
    trace.add_notes(absl::StrCat("loomd kept the first ", kMaxTraceEvents,
                                 " events; ask for fewer steps for the rest"));
  }
  return trace;
}

}  // namespace loom::jobs
