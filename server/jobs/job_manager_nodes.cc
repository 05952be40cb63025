// The JobManager's node administration and node faults: DrainNode and DeleteNode (operators),
// a worker that announces it is stopping, a node that cannot prepare a job (disk full), and the
// quarantine of gangs unknown to a loomd that started fresh (see job_manager.h).
//
// Choices:
//  - Drain does not move running gangs unless asked (move_jobs): a long job on a node being
//    drained for maintenance usually should finish; the operator who cannot wait moves it, and
//    the move costs the job no restart. An operator's drain survives the worker's restarts; the
//    worker's own drain (SIGTERM) ends when it registers again.
//  - Delete refuses a READY node or one that runs work: a live worker would register again at
//    once, and deleting would fail its gangs over. --force does it anyway (gangs re-queued free).
//  - A quarantined gang stays until the operator decides (DrainNode stop_quarantined, or
//    DeleteNode force); loomd never learns its spec, so it cannot adopt it.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/job_manager_helpers.h"

namespace loom::jobs {
namespace {

using internal::IsGangState;
using internal::PlacedOn;

// Quarantined gangs remembered per node; a worker reporting more is not a fresh-start accident.
constexpr int kMaxQuarantinedPerNode = 64;
constexpr size_t kMaxReasonBytes = 256;

std::string QuarantineKey(const std::string& job, int64_t generation) {
  return absl::StrCat(job, "@", generation);
}

// "nodes/{id}" -> itself after checking the id; INVALID_ARGUMENT naming `field`.
absl::StatusOr<std::string> ParseNodeName(std::string_view name, std::string_view field) {
  constexpr std::string_view kPrefix = "nodes/";
  v1::RegisterNodeRequest check;
  if (name.substr(0, kPrefix.size()) == kPrefix) {
    check.set_node_id(std::string(name.substr(kPrefix.size())));
  }
  check.add_devices()->set_kind(v1::DEVICE_KIND_CPU);
  if (check.node_id().empty() || !nodes::ValidateRegistration(check).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(field), " \"", std::string(name.substr(0, 80)),
                     "\" must look like nodes/{id} with an id of [a-z0-9-]{1,63}, e.g. "
                     "nodes/gpu-node-1 (see loomctl nodes list)"));
  }
  return std::string(name);
}

absl::Status NodeNotFound(const std::string& name) {
  return absl::NotFoundError(
      absl::StrCat("node ", name, " is not registered (see loomctl nodes list)"));
}

}  // namespace

absl::StatusOr<v1::Node> JobManager::DrainNode(const v1::DrainNodeRequest& request) {
  ASSIGN_OR_RETURN(const std::string name, ParseNodeName(request.name(), "name"));
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("loomd is shutting down; retry later");
  nodes::NodeEntry* entry = nodes_.Find(name);
  if (entry == nullptr) return NodeNotFound(name);
  const bool drain = !request.has_drain() || request.drain();
  v1::Node updated = entry->node;
  updated.set_draining(drain);
  updated.set_drain_reason(drain ? absl::StrCat(nodes::kOperatorDrainPrefix,
                                                "drained with DrainNode (loomctl nodes drain)")
                                 : "");
  if (request.stop_quarantined()) updated.clear_quarantined();
  RETURN_IF_ERROR(store_->PutNode(updated));
  const v1::Node before = std::exchange(entry->node, std::move(updated));
  LOOM_LOG(INFO) << name << (drain ? " drained by an operator" : " undrained by an operator");
  if (request.stop_quarantined()) {
    for (const std::string& key : before.quarantined()) {
      const size_t at = key.rfind('@');
      int64_t generation = 0;
      if (at == std::string::npos || !absl::SimpleAtoi(key.substr(at + 1), &generation)) continue;
      SendCancelLocked({name}, key.substr(0, at), generation,
                       "quarantined gang stopped by an operator");
    }
  }
  if (drain && request.move_jobs()) {
    MoveGangsOffLocked(name, absl::StrCat(name, " was drained by an operator"),
                       options_.drain_requeue_delay);
  }
  ScheduleLocked();
  for (v1::Node& node : nodes_.List()) {
    if (node.name() == name) return node;
  }
  return NodeNotFound(name);
}

absl::Status JobManager::DeleteNode(const v1::DeleteNodeRequest& request) {
  ASSIGN_OR_RETURN(const std::string name, ParseNodeName(request.name(), "name"));
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("loomd is shutting down; retry later");
  nodes::NodeEntry* entry = nodes_.Find(name);
  if (entry == nullptr) return NodeNotFound(name);
  int gangs = 0;
  for (const auto& [job, active] : active_) {
    if (IsGangState(active->job.state()) && PlacedOn(active->job, name)) ++gangs;
  }
  const bool ready = entry->node.state() == v1::NODE_STATE_READY;
  if ((ready || gangs > 0 || entry->node.quarantined_size() > 0) && !request.force()) {
    return absl::FailedPreconditionError(absl::StrCat(
        name, " is ", v1::NodeState_Name(entry->node.state()), " and runs ", gangs, " gangs and ",
        entry->node.quarantined_size(),
        " quarantined gangs; stop its worker first (after loomctl nodes drain --move-jobs), or "
        "pass force (loomctl nodes delete --force) to delete it anyway"));
  }
  if (gangs > 0) {
    MoveGangsOffLocked(name, absl::StrCat(name, " was deleted by an operator"),
                       absl::ZeroDuration());
  }
  for (const std::string& key : entry->node.quarantined()) {
    const size_t at = key.rfind('@');
    int64_t generation = 0;
    if (at == std::string::npos || !absl::SimpleAtoi(key.substr(at + 1), &generation)) continue;
    SendCancelLocked({name}, key.substr(0, at), generation, "node deleted by an operator");
  }
  RETURN_IF_ERROR(store_->DeleteNode(name));
  nodes_.Remove(name);
  for (auto& [job, active] : active_) active->avoid_nodes.erase(name);
  LOOM_LOG(INFO) << name << " deleted by an operator" << (request.force() ? " (forced)" : "");
  ScheduleLocked();
  return absl::OkStatus();
}

void JobManager::HandleWorkerDrainingLocked(const std::string& node,
                                            const v1::WorkerDraining& draining) {
  nodes::NodeEntry* entry = nodes_.Find(node);
  if (entry == nullptr) return;
  const std::string reason =
      draining.reason().empty() ? "stopping" : draining.reason().substr(0, kMaxReasonBytes);
  const v1::Node before = entry->node;
  entry->node.set_draining(true);
  entry->node.set_drain_reason(absl::StrCat("worker: ", reason));
  if (absl::Status s = PersistNodeLocked(*entry, entry->node.state()); !s.ok()) {
    entry->node = before;
    LOOM_LOG(ERROR) << "cannot mark " << node << " draining: " << s;
    return;
  }
  LOOM_LOG(INFO) << node << " is draining: its worker is " << reason;
  MoveGangsOffLocked(node, absl::StrCat("the worker of ", node, " is stopping (", reason, ")"),
                     options_.drain_requeue_delay);
}

void JobManager::NotePrepareFailureLocked(const std::string& node, ActiveJob& active,
                                          const v1::RankStatus& status) {
  const std::string error = status.prepare_error().substr(0, kMaxReasonBytes);
  active.avoid_nodes.insert(node);
  if (status.no_space()) {
    if (nodes::NodeEntry* entry = nodes_.Find(node); entry != nullptr) {
      const v1::Node before = entry->node;
      entry->node.set_unhealthy_reason(absl::StrCat("disk full: ", error));
      if (absl::Status s = PersistNodeLocked(*entry, entry->node.state()); !s.ok()) {
        entry->node = before;
        LOOM_LOG(ERROR) << "cannot mark " << node << " unhealthy: " << s;
      } else {
        LOOM_LOG(WARNING) << node << " is unhealthy: disk full (" << error << ")";
      }
    }
  }
  const std::string what = absl::StrCat(node, " could not prepare the job: ", error);
  if (status.exit_class() == v1::EXIT_CLASS_PERMANENT) {
    FailGangLocked(active, /*retryable=*/false, what);
    return;
  }
  RequeueGangLocked(active, absl::StrCat(what, "; avoiding that node for this job"),
                    absl::ZeroDuration());
}

bool JobManager::QuarantinedLocked(const std::string& node, const std::string& job,
                                   int64_t generation, bool add) {
  nodes::NodeEntry* entry = nodes_.Find(node);
  if (entry == nullptr) return false;
  const std::string key = QuarantineKey(job, generation);
  for (const std::string& q : entry->node.quarantined()) {
    if (q == key) return true;
  }
  if (!add || !options_.quarantine_unknown_gangs || !ParseJobName(job).ok() ||
      entry->node.quarantined_size() >= kMaxQuarantinedPerNode) {
    return false;
  }
  entry->node.add_quarantined(key);
  // Stored, so that a later loomd keeps it alive too (a failed write keeps it in memory: the
  // gang is not killed for it).
  if (absl::Status s = PersistNodeLocked(*entry, entry->node.state()); !s.ok()) {
    LOOM_LOG(ERROR) << "cannot store the quarantine of " << key << " on " << node << ": " << s;
  }
  LOOM_LOG(WARNING) << node << " runs " << key
                    << ", which this loomd (started fresh) does not know: quarantined, left "
                       "running; stop it with loomctl nodes drain "
                    << node << " --stop-quarantined";
  return true;
}

void JobManager::MoveGangsOffLocked(const std::string& node, const std::string& why,
                                    absl::Duration delay) {
  std::vector<std::string> names;
  for (const auto& [name, active] : active_) {
    if (IsGangState(active->job.state()) && PlacedOn(active->job, node)) names.push_back(name);
  }
  for (const std::string& name : names) {
    auto it = active_.find(name);
    if (it != active_.end()) RequeueGangLocked(*it->second, why, delay, /*checkpoint=*/true);
  }
}

void JobManager::ForgetEndedQuarantinesLocked(
    nodes::NodeEntry& entry, const std::set<std::pair<std::string, int64_t>>& running) {
  if (entry.node.quarantined_size() == 0) return;
  v1::Node updated = entry.node;
  updated.clear_quarantined();
  for (const std::string& key : entry.node.quarantined()) {
    const size_t at = key.rfind('@');
    int64_t generation = 0;
    if (at != std::string::npos && absl::SimpleAtoi(key.substr(at + 1), &generation) &&
        running.contains({key.substr(0, at), generation})) {
      updated.add_quarantined(key);
    } else {
      LOOM_LOG(INFO) << entry.node.name() << " no longer runs the quarantined " << key
                     << "; quarantine lifted";
    }
  }
  if (updated.quarantined_size() == entry.node.quarantined_size()) return;
  const v1::Node before = std::exchange(entry.node, std::move(updated));
  if (absl::Status s = PersistNodeLocked(entry, entry.node.state()); !s.ok()) {
    entry.node = before;
    LOOM_LOG(ERROR) << "cannot store " << entry.node.name() << "'s quarantines: " << s;
  }
}

}  // namespace loom::jobs
