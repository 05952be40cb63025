// The worker side of the JobManager: node registration, sessions and their reconciliation,
// rank reports, progress, and everything driven by time (see job_manager.h for the contract).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/rank_status_batch.h"
#include "common/status_macros.h"
#include "server/jobs/checkpoint_placement.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/job_manager_helpers.h"
#include "server/jobs/job_state_machine.h"
#include "server/planner_service/plan_mapping.h"

namespace loom::jobs {
namespace {

using internal::DescribeExit;
using internal::IsGangState;
using internal::PlacedOn;
using internal::PlacementNodes;
using internal::RankPlacedOn;
using internal::ToProto;

std::string StaleKey(std::string_view node, std::string_view job, int64_t generation) {
  return absl::StrCat(std::string(node), "|", std::string(job), "|", generation);
}

// Ended gangs whose late log lines are still accepted: a gang's workers flush within a second of
// its end, and thousands of gangs do not end within a second.
constexpr size_t kEndedGangsKept = 4096;

}  // namespace

// ---- Nodes ------------------------------------------------------------------------------------

absl::StatusOr<v1::RegisterNodeResponse> JobManager::RegisterNode(
    const v1::RegisterNodeRequest& request) {
  RETURN_IF_ERROR(nodes::ValidateRegistration(request, options_.device_limits));
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("loomd is shutting down; retry later");
  const absl::Time now = clock_->Now();
  RETURN_IF_ERROR(RefuseLiveNodeLocked(nodes::NodeName(request.node_id()), "node_id"));
  const v1::Node node = nodes_.Registered(request, now);
  RETURN_IF_ERROR(store_->PutNode(node));
  const bool known = nodes_.Find(node.name()) != nullptr;
  nodes_.Put(node, now);
  // A worker that registers again may have been fixed (disk freed, restarted): jobs that
  // avoided it may use it again.
  for (auto& [name, active] : active_) active->avoid_nodes.erase(node.name());
  LOOM_LOG(INFO) << (known ? "re-registered " : "registered ") << node.name() << " with "
                 << node.devices_size() << " devices";
  ScheduleLocked();
  v1::RegisterNodeResponse response;
  for (const v1::Node& listed : nodes_.List()) {
    if (listed.name() == node.name()) *response.mutable_node() = listed;
  }
  response.set_heartbeat_interval_ms(
      static_cast<int32_t>(absl::ToInt64Milliseconds(options_.heartbeat_interval)));
  response.set_accepts_rank_status_batches(true);
  return response;
}

absl::Status JobManager::RefuseLiveNodeLocked(const std::string& node_name,
                                              absl::string_view field) {
  const nodes::NodeEntry* entry = nodes_.Find(node_name);
  if (entry == nullptr || entry->session == nullptr) return absl::OkStatus();
  const absl::Duration silent = clock_->Now() - entry->last_seen;
  if (silent >= options_.node_timeout) return absl::OkStatus();
  return absl::AlreadyExistsError(absl::StrCat(
      field, ": ", node_name, " is live (its session is open, last heard from ",
      absl::FormatDuration(absl::Trunc(silent, absl::Milliseconds(1))),
      " ago); a second worker cannot take over its id. Give this worker another --node-id, or "
      "stop the other one (its id is free once its session ends or after the node timeout, ",
      absl::FormatDuration(options_.node_timeout), ")"));
}

v1::ListNodesResponse JobManager::ListNodes(bool with_quarantined) {
  absl::MutexLock lock(&mu_);
  v1::ListNodesResponse response;
  for (v1::Node& node : nodes_.List()) {
    if (!with_quarantined) node.clear_quarantined();
    *response.add_nodes() = std::move(node);
  }
  return response;
}

absl::Status JobManager::PersistNodeLocked(nodes::NodeEntry& entry, v1::NodeState state) {
  v1::Node node = entry.node;
  node.set_state(state);
  *node.mutable_last_heartbeat() = ToProto(entry.last_seen);
  RETURN_IF_ERROR(store_->PutNode(node));
  if (entry.node.state() != state) pass_due_ = true;  // the ready nodes changed
  entry.node = std::move(node);
  return absl::OkStatus();
}

// ---- Sessions ---------------------------------------------------------------------------------

// Reconciliation on hello. For each (job, generation) the worker runs: keep it when the store
// says that job is SCHEDULED/RUNNING at that generation with a placement on this node, else
// tell the worker to cancel it (stale generation fencing). A gang loomd placed on this node that
// the worker does not list may have finished while loomd was away (the worker re-sends its last
// exit reports right after hello) or may be gone: it gets the reconcile grace to be accounted
// for, then fails over (CheckMissingLocked). This is what makes a loomd restart safe: nothing is
// launched again for a gang that still runs, and a gang that vanished with its worker restarts
// under its restart policy.
absl::StatusOr<uint64_t> JobManager::OpenSession(const v1::SessionHello& hello,
                                                 std::shared_ptr<nodes::SessionSink> sink) {
  v1::RegisterNodeRequest id_check;
  id_check.set_node_id(hello.node_id());
  id_check.add_devices()->set_kind(v1::DEVICE_KIND_CPU);
  if (absl::Status status = nodes::ValidateRegistration(id_check); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("hello.", status.message()));
  }
  const std::string node_name = nodes::NodeName(hello.node_id());
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("loomd is shutting down; reconnect later");
  nodes::NodeEntry* entry = nodes_.Find(node_name);
  if (entry == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("hello.node_id \"", hello.node_id(),
                     "\" is not registered; call RegisterNode before opening a session"));
  }
  RETURN_IF_ERROR(RefuseLiveNodeLocked(node_name, "hello.node_id"));
  entry->last_seen = clock_->Now();
  if (entry->node.state() != v1::NODE_STATE_READY) {
    RETURN_IF_ERROR(PersistNodeLocked(*entry, v1::NODE_STATE_READY));
    LOOM_LOG(INFO) << node_name << " is READY again";
  }
  const uint64_t session_id = nodes_.OpenSession(node_name, std::move(sink));
  std::erase_if(stale_cancelled_, [&](const std::string& key) {
    return key.compare(0, node_name.size() + 1, node_name + "|") == 0;
  });

  std::set<std::pair<std::string, int64_t>> reported;
  for (const v1::RunningJob& running : hello.running()) {
    reported.insert({running.job(), running.generation()});
  }
  ForgetEndedQuarantinesLocked(*entry, reported);
  for (const v1::RunningJob& running : hello.running()) {
    auto it = active_.find(running.job());
    const bool keep = it != active_.end() && IsGangState(it->second->job.state()) &&
                      it->second->job.generation() == running.generation() &&
                      PlacedOn(it->second->job, node_name);
    if (!keep && it == active_.end() && !store_->GetJob(running.job()).ok() &&
        QuarantinedLocked(node_name, running.job(), running.generation(), /*add=*/true)) {
      continue;  // unknown to a loomd that started fresh: left running for an operator
    }
    if (!keep) {
      SendCancelLocked({node_name}, running.job(), running.generation(),
                       "loomd does not run this job at this generation on this node");
      stale_cancelled_.insert(StaleKey(node_name, running.job(), running.generation()));
      continue;
    }
    ActiveJob& active = *it->second;
    for (int rank : running.ranks()) {
      if (RankPlacedOn(active.job, node_name, rank)) active.running_ranks.insert(rank);
    }
    MaybeMarkRunningLocked(active);
  }
  const absl::Time grace_end = clock_->Now() + options_.reconcile_grace;
  for (const auto& [name, active] : active_) {
    if (IsGangState(active->job.state()) && PlacedOn(active->job, node_name) &&
        !reported.contains({name, active->job.generation()})) {
      active->missing_on[node_name] = grace_end;
    }
  }
  LOOM_LOG(INFO) << node_name << " session " << session_id << " open; " << hello.running_size()
                 << " running jobs reported";
  ScheduleLocked();
  return session_id;
}

void JobManager::CloseSession(std::string_view node_id, uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  nodes_.CloseSession(nodes::NodeName(node_id), session_id);
}

absl::Status JobManager::HandleWorkerMessage(std::string_view node_id, uint64_t session_id,
                                             const v1::WorkerMessage& message) {
  const std::string node_name = nodes::NodeName(node_id);
  {
    absl::MutexLock lock(&mu_);
    if (!nodes_.IsCurrentSession(node_name, session_id)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this session of ", node_name, " was replaced or closed; open a new one with hello"));
    }
    nodes::NodeEntry* entry = nodes_.Find(node_name);
    entry->last_seen = clock_->Now();
    *entry->node.mutable_last_heartbeat() = ToProto(entry->last_seen);
    switch (message.msg_case()) {
      case v1::WorkerMessage::kHeartbeat:
      case v1::WorkerMessage::kLogs:
        break;
      case v1::WorkerMessage::kRankStatus:
        // Only a gang that leaves its devices (it ended, failed or went back to the queue) can
        // make a queued job placeable. A rank's RUNNING report, or one exit of several, frees
        // nothing, and a scheduling pass walks the whole queue: a gang of N ranks reports 2N
        // times. (The tick schedules too, whatever happened.)
        if (HandleRankStatusFreesLocked(node_name, message.rank_status())) ScheduleLocked();
        break;
      case v1::WorkerMessage::kRankStatuses: {
        const auto& statuses = message.rank_statuses().statuses();
        if (statuses.size() > kMaxRankStatusesPerBatch) {
          return absl::InvalidArgumentError(absl::StrCat(
              "rank_statuses.statuses has ", statuses.size(), " entries; at most ",
              kMaxRankStatusesPerBatch, " per message (send the rest in further messages)"));
        }
        // As if sent one by one, with one scheduling pass for whatever they freed together.
        bool freed = false;
        for (const v1::RankStatus& status : statuses) {
          freed = HandleRankStatusFreesLocked(node_name, status) || freed;
        }
        if (freed) ScheduleLocked();
        break;
      }
      case v1::WorkerMessage::kStep:
        HandleStepLocked(node_name, message.step());
        break;
      case v1::WorkerMessage::kDraining:
        HandleWorkerDrainingLocked(node_name, message.draining());
        break;
      case v1::WorkerMessage::kStackDump:
        HandleStackDumpLocked(node_name, message.stack_dump());
        break;
      case v1::WorkerMessage::kTraceChunk:
        break;  // below, outside the lock
      case v1::WorkerMessage::kHello:
        return absl::InvalidArgumentError(
            "hello may only be the first message of a session; open a new session instead");
      case v1::WorkerMessage::MSG_NOT_SET:
        return absl::InvalidArgumentError(
            "msg is empty; send one of heartbeat, rank_status, rank_statuses, step or logs");
    }
    // Whatever the message ended (a gang's success commits kWithNextSync), on disk and told
    // before the lock is released: synced by the next gang's placement above, or here.
    SyncHeldLocked();
  }
  // Disk I/O for logs happens outside the lock.
  if (message.has_logs()) AppendLogs(node_name, message.logs());
  // Timeline chunks go to the request waiting for them (its own lock; bounded there).
  if (message.has_trace_chunk()) traces_.Accept(node_name, message.trace_chunk());
  return absl::OkStatus();
}

JobManager::ActiveJob* JobManager::CurrentGangLocked(const std::string& node,
                                                     const std::string& job, int64_t generation,
                                                     bool quiet) {
  auto it = active_.find(job);
  if (it != active_.end() && IsGangState(it->second->job.state()) &&
      it->second->job.generation() == generation && PlacedOn(it->second->job, node)) {
    return it->second.get();
  }
  if (QuarantinedLocked(node, job, generation, /*add=*/false)) return nullptr;
  if (!quiet && ParseJobName(job).ok() &&
      stale_cancelled_.insert(StaleKey(node, job, generation)).second) {
    SendCancelLocked({node}, job, generation,
                     "stale report: loomd does not run this job at this generation here");
  }
  return nullptr;
}

bool JobManager::HoldsDevicesLocked(const std::string& job) const {
  auto it = active_.find(job);
  return it != active_.end() && IsGangState(it->second->job.state());
}

void JobManager::MaybeMarkRunningLocked(ActiveJob& active) {
  if (active.job.state() != v1::SCHEDULED) return;
  std::set<int> started = active.running_ranks;
  started.insert(active.succeeded_ranks.begin(), active.succeeded_ranks.end());
  if (static_cast<int>(started.size()) < active.world_size) return;
  // Not synced on its own: after a power loss the workers' hello tells loomd again that the gang
  // runs, and this transition is made again (the next synced write takes it to disk anyway).
  // Syncing it cost a WAL sync between a gang's last exits and the next gang's placement.
  absl::Status status = TransitionLocked(active, active.job, v1::RUNNING,
                                         absl::StrCat("all ", active.world_size, " ranks started"),
                                         RestartCharge::kCharged, Commit::kDeferred);
  if (!status.ok()) {
    LOOM_LOG(ERROR) << "cannot mark " << active.job.name() << " RUNNING: " << status;
    return;
  }
  active.last_progress = clock_->Now();  // the start-up allowance counts from here
}

bool JobManager::HandleRankStatusFreesLocked(const std::string& node,
                                             const v1::RankStatus& status) {
  const bool held = HoldsDevicesLocked(status.job());
  HandleRankStatusLocked(node, status);
  return held && !HoldsDevicesLocked(status.job());
}

void JobManager::HandleRankStatusLocked(const std::string& node, const v1::RankStatus& status) {
  const bool exited = status.phase() == v1::RANK_PHASE_EXITED;
  if (exited) NoteLeavingExitLocked(node, status);
  ActiveJob* active = CurrentGangLocked(node, status.job(), status.generation(), exited);
  if (active == nullptr) return;
  if (!RankPlacedOn(active->job, node, status.rank())) {
    LOOM_LOG(WARNING) << node << " reported rank " << status.rank() << " of " << status.job()
                      << ", which is not placed there; ignored";
    return;
  }
  switch (status.phase()) {
    case v1::RANK_PHASE_RUNNING:
      active->missing_on.erase(node);
      active->running_ranks.insert(status.rank());
      MaybeMarkRunningLocked(*active);
      return;
    case v1::RANK_PHASE_EXITED:
      break;
    default:
      return;
  }
  if (!status.prepare_error().empty() && status.exit_class() != v1::EXIT_CLASS_STOPPED) {
    NotePrepareFailureLocked(node, *active, status);
    return;
  }
  switch (status.exit_class()) {
    case v1::EXIT_CLASS_SUCCESS: {
      active->succeeded_ranks.insert(status.rank());
      if (static_cast<int>(active->succeeded_ranks.size()) < active->world_size) {
        MaybeMarkRunningLocked(*active);
        return;
      }
      MaybeMarkRunningLocked(*active);  // SUCCEEDED is entered from RUNNING only
      auto it = active_.find(status.job());
      if (it == active_.end() || it->second->job.state() != v1::RUNNING) return;
      v1::Job updated = it->second->job;
      updated.clear_placements();
      // Calibration learns from the finished job's plan and measured step (`it` is gone after
      // the transition).
      std::optional<v1::Job> finished;
      if (calibrator_ != nullptr && updated.has_plan_check()) finished = updated;
      // Unsynced until the next gang's placement (the caller schedules right after) or
      // HandleWorkerMessage's SyncHeldLocked() syncs it: one sync between two gangs, not two.
      absl::Status s = TransitionLocked(
          *it->second, std::move(updated), v1::SUCCEEDED,
          absl::StrCat("all ", it->second->world_size, " ranks exited successfully"),
          RestartCharge::kCharged, Commit::kWithNextSync);
      if (!s.ok()) {
        LOOM_LOG(ERROR) << "cannot mark " << status.job() << " SUCCEEDED: " << s;
        return;
      }
      if (finished.has_value()) {
        absl::StatusOr<std::optional<v1::PlanCalibration>> learnt =
            calibrator_->LearnFromFinishedJob(*finished);
        if (!learnt.ok()) {
          LOOM_LOG(WARNING) << "calibration cannot learn from " << status.job() << ": "
                            << learnt.status();
        } else if (learnt->has_value()) {
          LOOM_LOG(INFO) << "learnt from " << status.job() << ": "
                         << planner_service::CalibrationReason(**learnt);
        }
      }
      return;
    }
    case v1::EXIT_CLASS_STOPPED:
      // Stopped on loomd's order or because a peer failed; the peer's own report (or the node
      // timeout) decides what happens to the gang.
      return;
    case v1::EXIT_CLASS_PERMANENT:
      FailGangLocked(*active, /*retryable=*/false, DescribeExit(status));
      return;
    default:  // RETRYABLE, or a worker that did not classify: a crash is worth a restart
      FailGangLocked(*active, /*retryable=*/true, DescribeExit(status));
      return;
  }
}

namespace {

bool IsRatio(double v) { return std::isfinite(v) && v >= 0.0 && v <= 1.0; }

}  // namespace

void JobManager::RecordRankTelemetry(ActiveJob& active, const v1::StepReport& report) {
  server_metrics::RankTelemetry& telemetry = active.rank_telemetry[report.rank()];
  // loom-train and the worker's parser keep the ratios in [0, 1]; a report from a buggy or older
  // worker that does not is ignored rather than exported.
  if (IsRatio(report.overlap_ratio()) && IsRatio(report.bubble_ratio()) &&
      IsRatio(report.idle_ratio())) {
    telemetry.overlap_ratio = report.overlap_ratio();
    telemetry.bubble_ratio = report.bubble_ratio();
    telemetry.idle_ratio = report.idle_ratio();
  }
  // Only the "cuda" prefix of the free-text device matters: it never becomes a label value.
  const bool gpu = absl::StartsWith(report.device(), "cuda");
  server_metrics::RankMemory& memory = telemetry.memory.emplace();
  memory.allocated = report.memory_bytes();
  memory.peak = report.peak_memory_bytes();
  memory.rss = report.rss_bytes();
  if (gpu) {
    memory.gpu_reserved = report.reserved_memory_bytes();
    if (IsRatio(report.memory_fragmentation())) {
      memory.gpu_fragmentation = report.memory_fragmentation();
    }
  }
  auto [counted, first] = active.counted_steps.try_emplace(report.rank(), report.step());
  if (!first) {
    if (report.step() <= counted->second) return;
    counted->second = report.step();
  }
  if (std::isfinite(report.step_seconds()) && report.step_seconds() >= 0) {
    telemetry.step_seconds = report.step_seconds();
  }
  for (const auto& [phase, seconds] : report.phase_seconds()) {
    // A negative or non-finite figure from a buggy worker would make the counter go down.
    if (!std::isfinite(seconds) || seconds < 0) continue;
    telemetry.phase_seconds_total[std::string(server_metrics::PhaseLabel(phase))] += seconds;
  }
  for (const auto& [kind, bytes] : report.comm_bytes()) {
    // Unknown kinds are summed under "other": the label values stay bounded.
    telemetry.comm_bytes_total[std::string(server_metrics::CommKindLabel(kind))] += bytes;
  }
  if (gpu) {
    telemetry.device_allocations_total =
        telemetry.device_allocations_total.value_or(0) + report.device_allocations();
  }
}

void JobManager::AddNoticeLocked(ActiveJob& active, const std::string& notice) {
  v1::JobEvent event;
  *event.mutable_time() = ToProto(clock_->Now());
  event.set_from_state(active.job.state());
  event.set_to_state(active.job.state());
  event.set_reason(notice);
  event.set_generation(active.job.generation());
  LOOM_LOG(WARNING) << active.job.name() << ": " << notice;
  absl::Status s = CommitLocked(active, active.job, event);
  if (!s.ok()) LOOM_LOG(WARNING) << "cannot record an event of " << active.job.name() << ": " << s;
}

void JobManager::HandleStepLocked(const std::string& node, const v1::StepReport& report) {
  ActiveJob* active = CurrentGangLocked(node, report.job(), report.generation(), false);
  if (active == nullptr || !RankPlacedOn(active->job, node, report.rank())) return;
  active->missing_on.erase(node);
  if (report.checkpoint()) {
    active->last_checkpoint = clock_->Now();
    // Every writer of a shard announces the save; rank 0's measurement stands for the gang's.
    if (report.rank() == 0) active->goodput.Checkpoint(report.checkpoint_seconds());
    // Progress for the watchdog (a long checkpoint write is not a hang), nothing more.
    if (active->job.state() == v1::SCHEDULED) {
      active->running_ranks.insert(report.rank());
      MaybeMarkRunningLocked(*active);
    }
    return;
  }
  if (!report.has_val_loss()) active->stepped = true;
  active->rank_progress[report.rank()] = clock_->Now();
  active->latest_steps[report.rank()] = report;
  if (!report.has_val_loss()) RecordRankTelemetry(*active, report);
  active->doctor_window.Add(report);
  if (step_observer_) step_observer_(report);
  if (active->job.state() == v1::SCHEDULED) {
    // A rank that reports steps has started, even if its RUNNING report was lost.
    active->running_ranks.insert(report.rank());
    MaybeMarkRunningLocked(*active);
  }
  if (report.rank() != 0) return;
  if (!report.has_val_loss() && !active->resume_checked) {
    // A restarted gang's first step says where it resumed: losing steps is never silent.
    // (Before `progress` below: the commit replaces the job message.)
    active->resume_checked = true;
    std::optional<std::string> notice = ResumeNotice(active->job.spec(), active->job.generation(),
                                                     report.step(), active->job.progress().step());
    if (notice.has_value()) AddNoticeLocked(*active, *notice);
  }
  const absl::Time now = clock_->Now();
  if (!report.has_val_loss()) {
    active->goodput.Step(active->job.generation(), report.step(), report.step_seconds(), now);
  }
  v1::JobProgress* progress = active->job.mutable_progress();
  if (report.has_val_loss()) {
    progress->set_val_loss(report.val_loss());
  } else {
    progress->set_step(report.step());
    progress->set_total_steps(report.total_steps());
    progress->set_loss(report.loss());
    progress->set_tokens_per_second(report.tokens_per_second());
    progress->set_lr(report.lr());
    // ETA from the observed rate since the generation's first report (restarts resume from a
    // checkpoint, so the rate is measured afresh), or from the step time before that.
    if (active->rate_start_step < 0 || report.step() < active->rate_start_step) {
      active->rate_start_step = report.step();
      active->rate_start_time = now;
    }
    const int64_t remaining = std::max<int64_t>(0, report.total_steps() - report.step());
    const double elapsed = absl::ToDoubleSeconds(now - active->rate_start_time);
    const int64_t done = report.step() - active->rate_start_step;
    if (done > 0 && elapsed > 0) {
      progress->set_eta_seconds(static_cast<double>(remaining) * elapsed / done);
    } else if (report.step_seconds() > 0) {
      progress->set_eta_seconds(static_cast<double>(remaining) * report.step_seconds());
    }
    if (active->step_times.Add(report) && active->job.has_plan()) {
      std::optional<v1::PlanCheck> check =
          MakePlanCheck(active->job.plan(), active->step_times, active->job.generation());
      if (check.has_value()) *active->job.mutable_plan_check() = std::move(*check);
    }
  }
  *progress->mutable_update_time() = ToProto(now);
  active->progress_dirty = true;
  if (now - active->last_progress_write >= options_.progress_persist_interval) {
    // Progress comes again with the next step report: no WAL sync per running job per second.
    absl::Status s = CommitLocked(*active, active->job, std::nullopt, Commit::kDeferred);
    if (!s.ok()) LOOM_LOG(WARNING) << "cannot persist progress of " << report.job() << ": " << s;
  } else {
    watchers_.Publish(active->job, /*state_change=*/false);
  }
}

void JobManager::NoteEndedGangLocked(const v1::Job& gang) {
  for (const v1::Placement& p : gang.placements()) {
    std::string key = StaleKey(p.node(), gang.name(), gang.generation());
    if (!ended_gangs_.insert(key).second) continue;
    ended_gang_order_.push_back(std::move(key));
    if (ended_gang_order_.size() > kEndedGangsKept) {
      ended_gangs_.erase(ended_gang_order_.front());
      ended_gang_order_.pop_front();
    }
  }
}

void JobManager::AppendLogs(const std::string& node, const v1::LogChunk& chunk) {
  absl::StatusOr<std::string> id = ParseJobName(chunk.job(), "logs.job");
  if (!id.ok() || logs_ == nullptr || chunk.rank() < 0) return;
  {
    absl::MutexLock lock(&mu_);
    auto it = active_.find(chunk.job());
    const bool running_here = it != active_.end() && IsGangState(it->second->job.state()) &&
                              it->second->job.generation() == chunk.generation() &&
                              RankPlacedOn(it->second->job, node, chunk.rank());
    if (!running_here && !ended_gangs_.contains(StaleKey(node, chunk.job(), chunk.generation()))) {
      return;  // not this node's gang: a worker's bug, or a node writing into others' logs
    }
  }
  absl::Status status = logs_->Append(*id, chunk, node, clock_->Now());
  if (!status.ok()) LOOM_LOG(WARNING) << "cannot store logs of " << chunk.job() << ": " << status;
}

// ---- Rendezvous -------------------------------------------------------------------------------

absl::Status JobManager::CheckRendezvousScope(std::string_view job, int64_t generation) {
  RETURN_IF_ERROR(ParseJobName(job, "scope.job").status());
  absl::MutexLock lock(&mu_);
  auto it = active_.find(job);
  if (it == active_.end()) {
    absl::StatusOr<store::StoredJob> stored = store_->GetJob(job);
    if (absl::IsNotFound(stored.status())) {
      return absl::NotFoundError(
          absl::StrCat("scope.job: job ", std::string(job), " does not exist"));
    }
    if (!stored.ok()) return stored.status();
    return absl::FailedPreconditionError(absl::StrCat("scope.job: job ", std::string(job),
                                                      " has ended (",
                                                      v1::JobState_Name(stored->job.state()), ")"));
  }
  const v1::Job& current = it->second->job;
  if (current.generation() != generation) {
    return absl::FailedPreconditionError(
        absl::StrCat("scope.generation ", generation, " is not the current generation of ",
                     std::string(job), " (", current.generation(), "); a stale rank must exit"));
  }
  if (!IsGangState(current.state())) {
    return absl::FailedPreconditionError(absl::StrCat("scope.job: the gang of ", std::string(job),
                                                      " is stopped (",
                                                      v1::JobState_Name(current.state()), ")"));
  }
  return absl::OkStatus();
}

// ---- Time -------------------------------------------------------------------------------------

void JobManager::CheckNodesLocked(absl::Time now) {
  for (nodes::NodeEntry* entry : nodes_.All()) {
    if (entry->node.state() != v1::NODE_STATE_READY) continue;
    if (now - entry->last_seen <= options_.node_timeout) continue;
    absl::Status status = PersistNodeLocked(*entry, v1::NODE_STATE_LOST);
    if (!status.ok()) {
      LOOM_LOG(ERROR) << "cannot mark " << entry->node.name() << " LOST: " << status;
      continue;
    }
    LOOM_LOG(WARNING) << entry->node.name() << " is LOST: no message for "
                      << absl::FormatDuration(now - entry->last_seen);
    nodes_.CloseSession(entry->node.name(), entry->session_id);
  }
  // Every gang with a rank on a node that is not READY (or not known at all) fails over.
  std::vector<std::pair<std::string, std::string>> failed;  // (job, node)
  for (const auto& [name, active] : gangs_) {
    if (!IsGangState(active->job.state())) continue;
    for (const v1::Placement& p : active->job.placements()) {
      const nodes::NodeEntry* entry = nodes_.Find(p.node());
      if (entry == nullptr || entry->node.state() != v1::NODE_STATE_READY) {
        failed.push_back({name, p.node()});
        break;
      }
    }
  }
  for (const auto& [job, node] : failed) {
    auto it = active_.find(job);
    if (it == active_.end()) continue;
    FailGangLocked(*it->second, /*retryable=*/true,
                   absl::StrCat("node ", node, " was lost (no heartbeat for ",
                                absl::FormatDuration(options_.node_timeout), ")"));
  }
}

void JobManager::CheckMissingLocked(absl::Time now) {
  std::vector<std::pair<std::string, std::string>> failed;  // (job, node)
  // A queued job's leftover entries are cleared when it is placed again (LaunchLocked).
  for (const auto& [name, active] : gangs_) {
    for (const auto& [node, deadline] : active->missing_on) {
      if (deadline > now || !IsGangState(active->job.state())) continue;
      // Ranks on that node that finished successfully account for themselves.
      bool all_done = true;
      for (const v1::Placement& p : active->job.placements()) {
        if (p.node() != node) continue;
        for (int rank : p.ranks()) all_done = all_done && active->succeeded_ranks.contains(rank);
      }
      if (!all_done) {
        failed.push_back({name, node});
        break;
      }
    }
    std::erase_if(active->missing_on, [&](const auto& kv) { return kv.second <= now; });
  }
  for (const auto& [job, node] : failed) {
    auto it = active_.find(job);
    if (it == active_.end()) continue;
    FailGangLocked(*it->second, /*retryable=*/true,
                   absl::StrCat(node, " reconnected without the ranks of generation ",
                                it->second->job.generation()));
  }
}

void JobManager::Tick() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  const absl::Time now = clock_->Now();
  CheckNodesLocked(now);
  CheckMissingLocked(now);
  CheckStartTimeoutsLocked(now);
  CheckProgressLocked(now);
  // Only gangs report progress; a queued job is never dirty (its last commit cleared the flag).
  std::vector<std::string> dirty;
  for (const auto& [name, active] : gangs_) {
    if (active->progress_dirty &&
        now - active->last_progress_write >= options_.progress_persist_interval) {
      dirty.push_back(name);
    }
  }
  for (const std::string& name : dirty) {
    ActiveJob& active = *active_.find(name)->second;
    absl::Status s = CommitLocked(active, active.job, std::nullopt);
    if (!s.ok()) LOOM_LOG(WARNING) << "cannot persist progress of " << name << ": " << s;
  }
  // Collected first: a doctor's re-split commits a transition while it runs (RequeueGangLocked).
  std::vector<ActiveJob*> running;
  for (const auto& [name, active] : gangs_) {
    if (active->job.state() == v1::RUNNING) running.push_back(active);
  }
  for (ActiveJob* active : running) RunDoctorLocked(*active);
  // A pass only when it could decide something the last one did not (PassDueLocked): a queue
  // at rest costs nothing here, however long.
  if (PassDueLocked(now)) ScheduleLocked();
}

void JobManager::StartTicker(absl::Duration interval) {
  ticker_ = std::thread([this, interval] {
    while (!stop_ticker_.WaitForNotificationWithTimeout(interval)) Tick();
  });
}

void JobManager::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    for (nodes::NodeEntry* entry : nodes_.All()) {
      nodes_.CloseSession(entry->node.name(), entry->session_id);
    }
  }
  watchers_.CloseAll();
  stop_ticker_.Notify();
  if (ticker_.joinable()) ticker_.join();
}

// ---- Telemetry --------------------------------------------------------------------------------

server_metrics::Snapshot JobManager::MetricsSnapshot() {
  absl::MutexLock lock(&mu_);
  server_metrics::Snapshot snapshot;
  snapshot.jobs = state_counts_;
  const absl::Time now = clock_->Now();
  for (const auto& [name, active] : active_) {
    const v1::JobState state = active->job.state();
    if (state == v1::QUEUED || (state == v1::RESTARTING && active->restart_at <= now)) {
      ++snapshot.queue_depth;
    }
  }
  for (const auto& [name, active] : active_) {
    server_metrics::JobStepTimes times;
    if (active->job.has_plan()) times.predicted_seconds = active->job.plan().step_seconds();
    if (std::optional<StepSample> median = active->step_times.Median(); median.has_value()) {
      times.measured_seconds = median->step;
    }
    const std::string id = name.substr(std::string_view("jobs/").size());
    if (times.predicted_seconds.has_value() || times.measured_seconds.has_value()) {
      snapshot.job_step_seconds[id] = times;
    }
    if (!active->rank_telemetry.empty()) {
      std::map<int, server_metrics::RankTelemetry>& ranks = snapshot.ranks[id];
      ranks = active->rank_telemetry;
      for (const v1::Placement& placement : active->job.placements()) {
        const nodes::NodeEntry* entry = nodes_.Find(placement.node());
        if (entry == nullptr) continue;
        for (int i = 0; i < placement.ranks_size() && i < placement.device_indices_size(); ++i) {
          auto rank = ranks.find(placement.ranks(i));
          if (rank == ranks.end()) continue;
          for (const v1::Device& device : entry->node.devices()) {
            if (device.index() == placement.device_indices(i) && device.memory_bytes() > 0) {
              rank->second.device_memory_bytes = device.memory_bytes();
            }
          }
        }
      }
    }
    {
      server_metrics::JobProgressTelemetry& progress = snapshot.progress[id];
      progress.restarts = active->job.restart_count();
      // The job's progress, not rank 0's latest report: that may be an evaluation, whose loss
      // and throughput fields are empty.
      if (const v1::JobProgress& p = active->job.progress(); p.step() > 0) {
        progress.step = p.step();
        if (std::isfinite(p.loss())) progress.loss = p.loss();
        if (std::isfinite(p.tokens_per_second()))
          progress.tokens_per_second = p.tokens_per_second();
      }
      if (auto at = active->rank_progress.find(0); at != active->rank_progress.end()) {
        progress.last_step_unix_seconds = absl::ToDoubleSeconds(at->second - absl::UnixEpoch());
      }
      if (times.predicted_seconds.has_value() && times.measured_seconds.has_value() &&
          *times.measured_seconds > 0 && active->job.plan().mfu() > 0) {
        progress.mfu =
            active->job.plan().mfu() * *times.predicted_seconds / *times.measured_seconds;
      }
    }
    {
      const v1::Goodput g = active->goodput.Snapshot(now);
      server_metrics::JobGoodput& out = snapshot.goodput[id];
      out.ratio = g.ratio();
      out.lost_seconds = {{"queued", g.queued_seconds()},
                          {"starting", g.starting_seconds()},
                          {"checkpointing", g.checkpointing_seconds()},
                          {"restarts", g.restart_seconds()},
                          {"rebalancing", g.rebalance_seconds()},
                          {"other", g.other_seconds()}};
    }
    if (active->doctor_report.windows() > 0) {
      server_metrics::JobDoctorTelemetry& doctor = snapshot.doctor[id];
      for (const v1::Finding& f : active->doctor_report.findings()) {
        ++doctor.findings[{doctor::KindName(f.kind()), doctor::SeverityName(f.severity())}];
      }
      const v1::JobReport& r = active->doctor_report;
      if (r.stages_size() > 1) {
        double sum = 0, most = 0;
        for (const v1::StageReport& st : r.stages()) {
          sum += st.busy_seconds();
          most = std::max(most, st.busy_seconds());
        }
        if (sum > 0) doctor.stage_imbalance_ratio = most / (sum / r.stages_size());
      }
      for (const v1::RankReport& rank : r.ranks()) {
        doctor.straggler_scores[rank.rank()] = rank.straggler_score();
      }
    }
  }
  for (const v1::Node& node : nodes_.List()) {
    snapshot.quarantined_gangs += node.quarantined_size();
    ++snapshot.nodes[node.state()];
    if (node.state() != v1::NODE_STATE_READY) continue;
    std::set<int> allocated(node.allocated_devices().begin(), node.allocated_devices().end());
    for (const v1::Device& device : node.devices()) {
      auto& [total, used] = snapshot.devices[device.kind() == v1::DEVICE_KIND_GPU ? "gpu" : "cpu"];
      ++total;
      if (allocated.contains(device.index())) ++used;
    }
  }
  return snapshot;
}

std::map<int, v1::StepReport> JobManager::LatestSteps(std::string_view name) {
  absl::MutexLock lock(&mu_);
  auto it = active_.find(name);
  if (it == active_.end()) return {};
  return it->second->latest_steps;
}

}  // namespace loom::jobs
