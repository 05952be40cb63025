#include "server/jobs/job_manager.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/echo.h"
#include "common/logging.h"
#include "common/spec_yaml.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/util/time_util.h"
#include "server/jobs/auto_plan.h"
#include "server/jobs/checkpoint_placement.h"
#include "server/jobs/job_manager_helpers.h"
#include "server/jobs/job_state_machine.h"
#include "server/jobs/memory_fit.h"
#include "server/planner_service/plan_mapping.h"
#include "server/scheduler/gang_scheduler.h"

namespace loom::jobs {

namespace {

using internal::FromProto;
using internal::IsGangState;
using internal::PlacementNodes;

constexpr char kPageTokenPrefix[] = "loom-page-v1";

std::string EncodePageToken(v1::JobState state, int64_t after_sequence) {
  return absl::WebSafeBase64Escape(
      absl::StrCat(kPageTokenPrefix, ":", static_cast<int>(state), ":", after_sequence));
}

absl::StatusOr<int64_t> DecodePageToken(const std::string& token, v1::JobState state) {
  const absl::Status bad = absl::InvalidArgumentError(
      "page_token is not a token from a previous ListJobs response; pass next_page_token "
      "unchanged, or omit page_token to start from the first page");
  std::string raw;
  if (!absl::WebSafeBase64Unescape(token, &raw)) return bad;
  std::vector<absl::string_view> parts = absl::StrSplit(raw, ':');
  int token_state = 0;
  int64_t sequence = 0;
  if (parts.size() != 3 || parts[0] != kPageTokenPrefix ||
      !absl::SimpleAtoi(parts[1], &token_state) || !absl::SimpleAtoi(parts[2], &sequence) ||
      sequence < 0) {
    return bad;
  }
  if (token_state != static_cast<int>(state)) {
    return absl::InvalidArgumentError(
        "page_token was issued for another state filter; repeat the request with the same "
        "state, or omit page_token to start over");
  }
  return sequence;
}

// The kind and number of devices a spec asks for.
std::pair<v1::DeviceKind, int> Demand(const v1::JobSpec& spec) {
  if (spec.resources().gpus() > 0) return {v1::DEVICE_KIND_GPU, spec.resources().gpus()};
  return {v1::DEVICE_KIND_CPU, std::max(1, spec.resources().cpu_devices())};
}

}  // namespace

absl::StatusOr<std::string> ParseJobName(std::string_view name, std::string_view field) {
  constexpr std::string_view kPrefix = "jobs/";
  if (name.substr(0, kPrefix.size()) != kPrefix || !IsSafeJobId(name.substr(kPrefix.size()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(field), " must look like jobs/{job} (got \"", std::string(name.substr(0, 80)),
        "\"); use the name returned by CreateJob or ListJobs"));
  }
  return std::string(name.substr(kPrefix.size()));
}

// ---- Construction -----------------------------------------------------------------------------

JobManager::JobManager(store::JobStore* store, const Clock* clock, SpecValidator validator,
                       LogStore* logs, rendezvous::RendezvousStore* rendezvous,
                       server_metrics::ServerMetrics* metrics, JobManagerOptions options,
                       calibration::Calibrator* calibrator)
    : store_(store),
      clock_(clock),
      validator_(std::move(validator)),
      logs_(logs),
      rendezvous_(rendezvous),
      metrics_(metrics),
      options_(std::move(options)),
      calibrator_(calibrator),
      rendezvous_address_(options_.rendezvous_address) {}

absl::StatusOr<std::unique_ptr<JobManager>> JobManager::Create(
    store::JobStore* store, const Clock* clock, SpecValidator validator, LogStore* logs,
    rendezvous::RendezvousStore* rendezvous, server_metrics::ServerMetrics* metrics,
    JobManagerOptions options, calibration::Calibrator* calibrator) {
  std::unique_ptr<JobManager> manager(new JobManager(store, clock, std::move(validator), logs,
                                                     rendezvous, metrics, std::move(options),
                                                     calibrator));
  RETURN_IF_ERROR(manager->Restore());
  return manager;
}

JobManager::~JobManager() { Shutdown(); }

absl::Status JobManager::Restore() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  ASSIGN_OR_RETURN(std::vector<v1::Node> nodes, store_->ListNodes());
  for (const v1::Node& node : nodes) nodes_.Restore(node, now);

  ASSIGN_OR_RETURN(std::vector<store::StoredJob> jobs, store_->ListActiveJobs());
  for (store::StoredJob& stored : jobs) {
    auto active = std::make_unique<ActiveJob>();
    active->sequence = stored.sequence;
    active->job = std::move(stored.job);
    active->goodput = doctor::GoodputLedger(FromProto(active->job.create_time()),
                                            active->job.goodput(), active->job.state(), now);
    std::tie(active->kind, active->world_size) = Demand(active->job.spec());
    active->tensor = PlacementGroup(active->job.spec(), active->job.layout());
    active->ready_since = now;
    active->restart_at = now;
    active->last_progress_write = now;
    // The watchdogs' clocks start afresh: loomd does not know how long the gang was silent.
    active->scheduled_at = now;
    active->last_progress = now;
    if (IsGangState(active->job.state())) {
      for (const v1::Placement& p : active->job.placements()) {
        nodes_.Allocate(p.node(), {p.device_indices().begin(), p.device_indices().end()},
                        active->job.name());
      }
    }
    const std::string name = active->job.name();
    ActiveJob* installed = active.get();
    active_.emplace(name, std::move(active));
    IndexLocked(name, installed, v1::JOB_STATE_UNSPECIFIED, installed->job.state());
  }

  // Count every stored job by state for loom_jobs{state}; later transitions keep it current.
  int64_t after = 0;
  while (true) {
    ASSIGN_OR_RETURN(store::JobPage page, store_->ListJobs(std::nullopt, after, 1000));
    for (const store::StoredJob& stored : page.jobs) ++state_counts_[stored.job.state()];
    if (page.jobs.empty() || !page.has_more) break;
    after = page.jobs.back().sequence;
  }
  LOOM_LOG(INFO) << "restored " << active_.size() << " active jobs and " << nodes.size()
                 << " nodes from the store";
  return absl::OkStatus();
}

// ---- Commit path ------------------------------------------------------------------------------

absl::Status JobManager::CommitLocked(ActiveJob& active, v1::Job updated,
                                      const std::optional<v1::JobEvent>& event, Commit commit) {
  const absl::Time now = clock_->Now();
  doctor::GoodputLedger goodput = active.goodput;
  if (updated.state() != active.job.state()) {
    goodput.EnterState(updated.state(), active.requeue_cause, now);
  }
  *updated.mutable_goodput() = goodput.Snapshot(now);
  RETURN_IF_ERROR(store_->UpdateJob(
      updated, event,
      commit == Commit::kSynced ? store::Durability::kSynced : store::Durability::kDeferred));
  active.goodput = std::move(goodput);
  if (updated.state() != active.job.state()) active.requeue_cause = doctor::WaitCause::kRestart;
  const std::string name = updated.name();
  const v1::JobState old_state = active.job.state();
  const v1::JobState new_state = updated.state();
  const bool terminal = IsTerminal(new_state);
  if (old_state != new_state) {
    --state_counts_[old_state];
    ++state_counts_[new_state];
    IndexLocked(name, &active, old_state, terminal ? v1::JOB_STATE_UNSPECIFIED : new_state);
  }
  if (IsGangState(old_state) &&
      (!IsGangState(new_state) || updated.generation() != active.job.generation())) {
    NoteEndedGangLocked(active.job);
  }
  // Allocations follow the placements of gang states exactly.
  nodes_.Release(name);
  if (IsGangState(new_state)) {
    for (const v1::Placement& p : updated.placements()) {
      nodes_.Allocate(p.node(), {p.device_indices().begin(), p.device_indices().end()}, name);
    }
  }
  if (rendezvous_ != nullptr && (terminal || updated.generation() != active.job.generation() ||
                                 new_state == v1::RESTARTING)) {
    // Entries of older generations (and of a stopped gang) can never be read again.
    rendezvous_->DropJob(name, terminal || new_state == v1::RESTARTING
                                   ? std::numeric_limits<int64_t>::max()
                                   : updated.generation());
  }
  active.job = std::move(updated);
  active.progress_dirty = false;
  active.last_progress_write = clock_->Now();
  if (commit == Commit::kSynced) PublishHeldLocked();  // this commit's sync took them to disk
  if (commit == Commit::kWithNextSync) {
    held_publications_.emplace_back(active.job, event.has_value());
  } else {
    watchers_.Publish(active.job, event.has_value());
  }
  if (terminal) active_.erase(name);  // `active` is gone from here on
  return absl::OkStatus();
}

void JobManager::PublishHeldLocked() {
  for (auto& [job, state_change] : held_publications_) watchers_.Publish(job, state_change);
  held_publications_.clear();
}

void JobManager::SyncHeldLocked() {
  if (held_publications_.empty()) return;
  // SQLite syncs no empty transaction, so the sync needs a write: the last held job again, as
  // it is stored (it is terminal, so nothing else wrote it since).
  const v1::Job& last = held_publications_.back().first;
  if (absl::Status s = store_->UpdateJob(last, std::nullopt, store::Durability::kSynced); !s.ok()) {
    // Committed but perhaps not on disk; withholding it would leave its watchers waiting.
    LOOM_LOG(ERROR) << "cannot sync the end of " << last.name() << ": " << s;
  }
  PublishHeldLocked();
}

absl::Status JobManager::TransitionLocked(ActiveJob& active, v1::Job updated, v1::JobState to,
                                          const std::string& reason, RestartCharge charge,
                                          Commit commit) {
  ASSIGN_OR_RETURN(v1::JobEvent event, Transition(updated, to, reason, clock_->Now(), charge));
  RETURN_IF_ERROR(CommitLocked(active, std::move(updated), event, commit));
  if (to == v1::RESTARTING && charge == RestartCharge::kCharged && metrics_ != nullptr) {
    metrics_->IncrementRestarts();
  }
  return absl::OkStatus();
}

// ---- Jobs -------------------------------------------------------------------------------------

absl::StatusOr<AcceptedSpec> JobManager::ValidateSpec(const v1::JobSpec& spec) {
  return validator_(spec, ReadyCapacity());
}

nodes::Capacity JobManager::ReadyCapacity() {
  absl::MutexLock lock(&mu_);
  return nodes_.ReadyCapacity();
}

absl::StatusOr<v1::Job> JobManager::CreateJob(const v1::CreateJobRequest& request,
                                              const std::string& tenant,
                                              const std::string& scale_test) {
  if (request.has_spec_yaml()) {
    // The spec as YAML (job.proto JobSpecYaml): converted here, outside the lock, by the reader
    // loomctl uses, then the request is the one the client could have sent with the spec.
    if (request.has_spec()) {
      return absl::InvalidArgumentError(
          "spec and spec_yaml are exclusive; send the spec one way (loomctl sends spec_yaml)");
    }
    ASSIGN_OR_RETURN(v1::JobSpec spec, JobSpecFromYamlMessage(request.spec_yaml()));
    v1::CreateJobRequest converted = request;  // every other field as sent
    converted.clear_spec_yaml();
    *converted.mutable_spec() = std::move(spec);
    return CreateJob(converted, tenant, scale_test);
  }
  // A scale test's copies carry ids of its own making ("scaletests/{id}/{devices}").
  if (scale_test.empty()) RETURN_IF_ERROR(store::CheckRequestId(request.request_id()));
  if (!request.has_spec()) {
    return absl::InvalidArgumentError(
        "spec is required; give at least train.steps and resources (see loomctl submit -f)");
  }
  // Throughput: only the two short critical sections below hold mu_. The idempotency lookup,
  // validation, planning and the durable insert (a group commit, shared with concurrent
  // creates) run outside it, so concurrent creates overlap instead of queueing on the lock.
  nodes::Capacity capacity;
  std::vector<v1::Node> nodes;
  std::string name;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("loomd is shutting down; retry later");
    capacity = nodes_.ReadyCapacity();
    nodes = nodes_.List();
    name = absl::StrCat("jobs/", internal::NewResourceId(clock_->Now(), id_gen_));
  }
  const std::string request_key =
      request.request_id().empty() ? "" : store::RequestKey(tenant, request.request_id());
  // A retry finds the job its first attempt created (and gets it back when the spec is the
  // same); see also the race below.
  auto find_existing = [&]() -> absl::StatusOr<std::optional<std::string>> {
    if (request_key.empty()) return std::optional<std::string>();
    ASSIGN_OR_RETURN(std::optional<store::StoredJob> existing,
                     store_->FindJobByRequestId(request_key));
    if (!existing.has_value()) return std::optional<std::string>();
    // Never another tenant's job, nor its name. Keys are per tenant, so only a job stored before
    // request ids were refused "/" can meet another tenant's key (a default-tenant "alice/x" is
    // alice's "x"); the caller just needs another id.
    if (!store::SameTenant(existing->job.tenant(), tenant)) {
      return absl::AlreadyExistsError(
          absl::StrCat("request_id ", Echo(request.request_id()),
                       " is already taken; use a new request_id (a UUID is a good choice)"));
    }
    RETURN_IF_ERROR(CheckSameRequest(request, existing->job));
    return std::optional<std::string>(existing->job.name());
  };
  ASSIGN_OR_RETURN(std::optional<std::string> existing, find_existing());
  if (existing.has_value()) return LoadJob(*existing);

  ASSIGN_OR_RETURN(AcceptedSpec accepted, validator_(request.spec(), capacity));
  const absl::Time now = clock_->Now();
  v1::Job job;
  std::string reason = "created; waiting for devices";
  if (IsAutoLayout(accepted.spec)) {
    // The planner picks the micro-batching (tensor = pipeline = 1 for now, see auto_plan.h);
    // when it cannot, the validator's layout stays and the reason says why.
    AutoPlanOutcome planned = PlanAutoLayout(
        request.spec(), accepted.spec, accepted.layout, nodes,
        calibrator_ != nullptr ? calibrator_->Applicable() : planner_service::CalibrationByModel());
    accepted.layout = std::move(planned.layout);
    accepted.spec.mutable_parallelism()->set_micro_batch(accepted.layout.micro_batch());
    if (planned.plan.has_value()) *job.mutable_plan() = std::move(*planned.plan);
    if (!planned.note.empty()) absl::StrAppend(&reason, "; ", planned.note);
  }
  // Refusals that depend on the final layout (auto's included).
  RETURN_IF_ERROR(
      CheckMemoryFit(accepted.spec, accepted.layout, IsAutoLayout(accepted.spec), nodes));
  RETURN_IF_ERROR(CheckCheckpointPlacement(accepted.spec, accepted.layout,
                                           accepted.spec.resources().gpus() > 0
                                               ? capacity.max_gpus_per_node
                                               : capacity.max_cpu_devices_per_node));
  job.set_name(name);
  *job.mutable_spec() = std::move(accepted.spec);
  *job.mutable_layout() = std::move(accepted.layout);
  job.set_request_id(request.request_id());
  job.set_tenant(tenant);
  job.set_scale_test(scale_test);
  ASSIGN_OR_RETURN(v1::JobEvent event, Transition(job, v1::QUEUED, reason, now));
  absl::StatusOr<int64_t> sequence = store_->CreateJob(job, event);
  if (absl::IsAlreadyExists(sequence.status()) && !request_key.empty()) {
    // Two attempts of one request raced past the lookup above: the store's unique index let
    // exactly one in. The loser answers as a retry would.
    ASSIGN_OR_RETURN(existing, find_existing());
    if (existing.has_value()) return LoadJob(*existing);
  }
  if (!sequence.ok()) return sequence.status();

  // Durable from here on: even if loomd stops now, the restart restores it as QUEUED.
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("loomd is shutting down; retry later");
  auto active = std::make_unique<ActiveJob>();
  active->sequence = *sequence;
  active->job = job;
  active->goodput = doctor::GoodputLedger(now, v1::Goodput(), v1::QUEUED, now);
  std::tie(active->kind, active->world_size) = Demand(job.spec());
  active->tensor = PlacementGroup(job.spec(), job.layout());
  active->ready_since = now;
  active->last_progress_write = now;
  const v1::DeviceKind kind = active->kind;
  const int world_size = active->world_size;
  ActiveJob* installed = active.get();
  active_.emplace(name, std::move(active));
  IndexLocked(name, installed, v1::JOB_STATE_UNSPECIFIED, v1::QUEUED);
  ++state_counts_[v1::QUEUED];
  if (!first_job_noted_ && options_.on_first_job) options_.on_first_job();
  first_job_noted_ = true;
  LOOM_LOG(INFO) << "created " << name << " (" << job.spec().name() << ")";
  // Every job already queued could not be placed at the last pass, and a newcomer frees
  // nothing; so a pass can change something only when the newcomer itself might fit. Skipping
  // it otherwise keeps a burst of creates into a full cluster from costing a pass over the
  // whole queue each (the ticker's pass fills in the newcomer's waiting reason).
  // (IndexLocked above marked a pass due, which the tick runs when this one is skipped.)
  if (FreeDevicesLocked(kind) >= world_size) ScheduleLocked();
  auto it = active_.find(name);
  if (it != active_.end() && it->second->job.state() == v1::QUEUED) {
    // Still as created (one event, the one above): answer from memory, without reading the
    // store back under the lock.
    v1::Job answer = it->second->job;
    if (!it->second->waiting_reason.empty()) {
      answer.set_state_reason(absl::StrCat("waiting for devices: ", it->second->waiting_reason));
    }
    v1::JobEvent* first = answer.add_events();
    *first = event;
    first->set_sequence(1);
    return answer;
  }
  return LoadJobLocked(name);
}

int JobManager::FreeDevicesLocked(v1::DeviceKind kind) const { return nodes_.FreeDevices(kind); }

namespace {

// A page of up to `page_size` jobs after `after`, only `tenant`'s when given. The store pages by
// sequence; other tenants' jobs are skipped by reading further pages, so a page is full whenever
// enough of the tenant's jobs exist and has_more is exact.
absl::StatusOr<store::JobPage> ListTenantPage(store::JobStore& store,
                                              std::optional<v1::JobState> filter, int64_t after,
                                              int page_size,
                                              const std::optional<std::string>& tenant) {
  if (!tenant.has_value()) return store.ListJobs(filter, after, page_size);
  store::JobPage result;
  while (true) {
    ASSIGN_OR_RETURN(store::JobPage page, store.ListJobs(filter, after, 1000));
    for (store::StoredJob& stored : page.jobs) {
      after = stored.sequence;
      const std::string& owner = stored.job.tenant();
      if ((owner.empty() ? std::string_view(auth::kDefaultTenant) : owner) != *tenant) continue;
      if (static_cast<int>(result.jobs.size()) == page_size) {
        result.has_more = true;
        return result;
      }
      result.jobs.push_back(std::move(stored));
    }
    if (!page.has_more) return result;
  }
}

}  // namespace

absl::Status JobManager::CheckSameRequest(const v1::CreateJobRequest& request,
                                          const v1::Job& existing) {
  // Both specs as the validator completes them, so that a retry that spells out a default (or
  // leaves one out) is still the same request. Capacity is left out of the comparison: a retry
  // must find its job even when the cluster has changed since.
  nodes::Capacity unlimited;
  unlimited.gpus = unlimited.cpu_devices = unlimited.max_gpus_per_node =
      unlimited.max_cpu_devices_per_node = std::numeric_limits<int>::max();
  unlimited.ready_nodes = 1;
  absl::StatusOr<AcceptedSpec> again = validator_(request.spec(), unlimited);
  bool same = again.ok();
  if (same) {
    v1::JobSpec retried = std::move(again->spec);
    // The stored micro-batch may be the planner's choice when the request left it out.
    if (request.spec().parallelism().micro_batch() == 0) {
      retried.mutable_parallelism()->set_micro_batch(existing.spec().parallelism().micro_batch());
    }
    same = google::protobuf::util::MessageDifferencer::Equals(retried, existing.spec());
  }
  if (same) return absl::OkStatus();
  return absl::AlreadyExistsError(absl::StrCat(
      "request_id ", Echo(request.request_id()), " was already used by ", existing.name(),
      " with a different spec; use a new request_id for a new job, or resend the same spec to "
      "get that job back"));
}

absl::StatusOr<v1::Job> JobManager::LoadJob(std::string_view name) {
  RETURN_IF_ERROR(ParseJobName(name).status());
  absl::MutexLock lock(&mu_);
  return LoadJobLocked(name);
}

absl::StatusOr<v1::Job> JobManager::LoadJobLocked(std::string_view name) {
  v1::Job job;
  auto it = active_.find(name);
  if (it != active_.end()) {
    job = it->second->job;
    if (job.state() == v1::QUEUED && !it->second->waiting_reason.empty()) {
      job.set_state_reason(absl::StrCat("waiting for devices: ", it->second->waiting_reason));
    }
  } else {
    absl::StatusOr<store::StoredJob> stored = store_->GetJob(name);
    if (absl::IsNotFound(stored.status())) {
      return absl::NotFoundError(absl::StrCat("job ", std::string(name),
                                              " not found; ListJobs shows the jobs that exist"));
    }
    if (!stored.ok()) return stored.status();
    job = std::move(stored->job);
  }
  ASSIGN_OR_RETURN(std::vector<v1::JobEvent> events, store_->ListEvents(name));
  for (v1::JobEvent& e : events) *job.add_events() = std::move(e);
  return job;
}

absl::StatusOr<v1::Job> JobManager::GetJob(std::string_view name) { return LoadJob(name); }

absl::StatusOr<v1::PlanJobResponse> JobManager::PlanJob(const v1::PlanJobRequest& request) {
  std::vector<v1::Node> nodes;
  {
    absl::MutexLock lock(&mu_);
    nodes = nodes_.List();
  }
  // Planning is pure and can take a while for large clusters: outside the lock.
  return planner_service::PlanJob(
      request, nodes,
      calibrator_ != nullptr ? calibrator_->Applicable() : planner_service::CalibrationByModel());
}

absl::StatusOr<v1::ListJobsResponse> JobManager::ListJobs(
    const v1::ListJobsRequest& request, const std::optional<std::string>& tenant) {
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be 1..1000 (got ", request.page_size(), "); omit it for 100"));
  }
  // AIP-158: a size above the maximum is coerced to it.
  const int page_size = request.page_size() == 0 ? 100 : std::min(request.page_size(), 1000);
  if (!v1::JobState_IsValid(request.state())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state ", static_cast<int>(request.state()),
        " is not a JobState; use QUEUED, SCHEDULED, RUNNING, SUCCEEDED, FAILED, CANCELLED or "
        "RESTARTING, or omit it for every state"));
  }
  int64_t after = 0;
  if (!request.page_token().empty()) {
    ASSIGN_OR_RETURN(after, DecodePageToken(request.page_token(), request.state()));
  }
  std::optional<v1::JobState> filter;
  if (request.state() != v1::JOB_STATE_UNSPECIFIED) filter = request.state();
  ASSIGN_OR_RETURN(store::JobPage page, ListTenantPage(*store_, filter, after, page_size, tenant));
  v1::ListJobsResponse response;
  absl::MutexLock lock(&mu_);
  for (store::StoredJob& stored : page.jobs) {
    v1::Job* job = response.add_jobs();
    auto it = active_.find(stored.job.name());
    // Fresher progress from memory, but the state as the store page says (the filter holds).
    if (it != active_.end() && it->second->job.state() == stored.job.state()) {
      *job = it->second->job;
    } else {
      *job = std::move(stored.job);
    }
  }
  if (page.has_more && !page.jobs.empty()) {
    response.set_next_page_token(EncodePageToken(request.state(), page.jobs.back().sequence));
  }
  return response;
}

absl::StatusOr<v1::Job> JobManager::CancelJob(std::string_view name) {
  RETURN_IF_ERROR(ParseJobName(name).status());
  {
    absl::MutexLock lock(&mu_);
    auto it = active_.find(name);
    if (it == active_.end()) {
      absl::StatusOr<store::StoredJob> stored = store_->GetJob(name);
      if (absl::IsNotFound(stored.status())) {
        return absl::NotFoundError(absl::StrCat("job ", std::string(name),
                                                " not found; ListJobs shows the jobs that exist"));
      }
      if (!stored.ok()) return stored.status();
      if (!IsTerminal(stored->job.state())) {
        // Stored by a CreateJob that has not installed it yet (a moment's window).
        return absl::UnavailableError(absl::StrCat(
            "job ", std::string(name), " is being created; retry the cancel in a moment"));
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", std::string(name), " is already ", v1::JobState_Name(stored->job.state()),
          "; only QUEUED, SCHEDULED, RUNNING or RESTARTING jobs can be cancelled"));
    }
    ActiveJob& active = *it->second;
    const std::vector<std::string> nodes = PlacementNodes(active.job);
    const int64_t generation = active.job.generation();
    v1::Job updated = active.job;
    updated.clear_placements();
    RETURN_IF_ERROR(
        TransitionLocked(active, std::move(updated), v1::CANCELLED, "cancelled by the user"));
    SendCancelLocked(nodes, std::string(name), generation, "job cancelled by the user");
    LOOM_LOG(INFO) << "cancelled " << name;
    ScheduleLocked();
  }
  return LoadJob(name);
}

absl::StatusOr<std::shared_ptr<JobSubscription>> JobManager::WatchJob(std::string_view name) {
  RETURN_IF_ERROR(ParseJobName(name).status());
  // Snapshot and subscribe under one hold of the lock, so that no update falls between them.
  // (Reading the store first and the live job under the lock lost the terminal update of a job
  // that ended in between: it had left active_, the stale stored state was subscribed to, and
  // the watch never ended. `loomctl submit --wait` hung on a job refused 2 ms after placement.)
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(v1::Job job, LoadJobLocked(name));
  return watchers_.Subscribe(job);
}

absl::StatusOr<bool> JobManager::IsJobFinished(std::string_view name) {
  RETURN_IF_ERROR(ParseJobName(name).status());
  absl::MutexLock lock(&mu_);
  if (active_.contains(name)) return shut_down_;
  absl::StatusOr<store::StoredJob> stored = store_->GetJob(name);
  if (absl::IsNotFound(stored.status())) {
    return absl::NotFoundError(absl::StrCat("job ", std::string(name), " not found"));
  }
  if (!stored.ok()) return stored.status();
  // Not active but not terminal: stored by a CreateJob that has not installed it yet.
  return IsTerminal(stored->job.state());
}

// ---- Scheduling -------------------------------------------------------------------------------

void JobManager::SetRendezvousAddress(std::string address) {
  absl::MutexLock lock(&mu_);
  rendezvous_address_ = std::move(address);
  ScheduleLocked();
}

void JobManager::IndexLocked(const std::string& name, ActiveJob* active, v1::JobState from,
                             v1::JobState to) {
  const auto is_gang = [](v1::JobState s) { return IsGangState(s) || s == v1::RESTARTING; };
  if (is_gang(from) && !is_gang(to)) gangs_.erase(name);
  if (!is_gang(from) && is_gang(to)) gangs_[name] = active;
  // What a pass decides (or writes into the waiting reasons) changes with every transition but
  // a gang's own SCHEDULED -> RUNNING: the queue, or the devices that are free.
  if (!(IsGangState(from) && IsGangState(to))) pass_due_ = true;
}

bool JobManager::PassDueLocked(absl::Time now) {
  if (pass_due_ || now - last_pass_ >= kPassSafetyInterval) return true;
  for (const auto& [name, active] : gangs_) {
    if (active->job.state() == v1::RESTARTING && active->restart_at > last_pass_ &&
        active->restart_at <= now) {
      return true;
    }
  }
  return false;
}

void JobManager::ScheduleLocked() {
  if (shut_down_ || rendezvous_address_.empty()) return;
  const absl::Time now = clock_->Now();
  std::vector<scheduler::JobRequest> queue;
  std::vector<ActiveJob*> owners;  // owners[i] asked for queue[i]
  queue.reserve(active_.size() - gangs_.size());
  owners.reserve(active_.size() - gangs_.size());
  for (const auto& [name, active] : active_) {
    const v1::JobState state = active->job.state();
    if (state != v1::QUEUED && !(state == v1::RESTARTING && active->restart_at <= now)) continue;
    scheduler::JobRequest& request = queue.emplace_back();
    request.job = name;
    request.priority = active->job.spec().priority();
    request.sequence = active->sequence;
    request.kind = active->kind;
    request.devices = active->world_size;
    request.tensor = active->tensor;
    request.avoid_nodes.assign(active->avoid_nodes.begin(), active->avoid_nodes.end());
    owners.push_back(active.get());
  }
  last_pass_ = now;
  pass_due_ = false;
  if (queue.empty()) return;
  scheduler::Decision decision = scheduler::Schedule(nodes_.Snapshot(), queue);
  bool launch_failed = false;
  for (scheduler::Waiting& waiting : decision.waiting) {
    ActiveJob& job = *owners[waiting.index];
    // The reason is shown to the waiting job's tenant: another tenant's job is not named.
    if (waiting.behind_index != scheduler::Waiting::kNone &&
        !store::SameTenant(owners[waiting.behind_index]->job.tenant(), job.job.tenant())) {
      job.waiting_reason =
          absl::StrReplaceAll(waiting.reason, {{waiting.behind, "another tenant's job"}});
    } else {
      job.waiting_reason = std::move(waiting.reason);
    }
  }
  // Placements change no job but the placed one: every owner stays valid through the launches.
  for (const scheduler::JobPlacement& placed : decision.placed) {
    ActiveJob* placed_job = owners[placed.index];
    std::vector<v1::Placement> placements;
    std::vector<std::string> parts;
    for (const scheduler::NodeShare& share : placed.nodes) {
      v1::Placement p;
      p.set_node(share.node);
      for (int d : share.device_indices) p.add_device_indices(d);
      for (int r : share.ranks) p.add_ranks(r);
      parts.push_back(
          absl::StrCat(share.node, " (devices ", absl::StrJoin(share.device_indices, ","), ")"));
      placements.push_back(std::move(p));
    }
    LaunchLocked(*placed_job, placements, absl::StrCat("placed on ", absl::StrJoin(parts, ", ")));
    // LaunchLocked never ends a job; a job it could not launch stays where it was. The
    // transitions of the launches set pass_due_ again: the reasons above already count them.
    if (placed_job->job.state() != v1::SCHEDULED) launch_failed = true;
  }
  pass_due_ = launch_failed;
}

void JobManager::LaunchLocked(ActiveJob& active, const std::vector<v1::Placement>& placements,
                              const std::string& reason) {
  const absl::Time now = clock_->Now();
  v1::Job updated = active.job;
  updated.clear_placements();
  for (const v1::Placement& p : placements) *updated.add_placements() = p;
  absl::Status status = TransitionLocked(active, std::move(updated), v1::SCHEDULED, reason);
  if (!status.ok()) {
    LOOM_LOG(ERROR) << "cannot schedule " << active.job.name() << ": " << status;
    return;
  }
  if (metrics_ != nullptr) metrics_->ObserveSchedulingLatency(now - active.ready_since);
  active.waiting_reason.clear();
  active.running_ranks.clear();
  active.succeeded_ranks.clear();
  active.latest_steps.clear();
  active.missing_on.clear();
  active.rate_start_step = -1;
  active.resume_checked = false;
  active.step_times.Reset();
  active.doctor_window.Reset();
  active.doctor_state = {};
  active.doctor_step = -1;
  active.doctor_report.Clear();
  active.doctor_planned = false;
  active.doctor_layout.reset();
  active.doctor_device_memory = 0;
  active.doctor_fits.clear();
  active.counted_steps.clear();
  active.scheduled_at = now;
  active.last_progress = now;
  active.last_checkpoint = absl::InfinitePast();
  active.rank_progress.clear();
  active.stepped = false;
  active.hung_stop_at.reset();
  active.hung_reason.clear();
  active.dumps.clear();
  // A new gang reports afresh: drop the old gang's ratios and memory, keep the job's byte and
  // device allocation totals.
  for (auto& [rank, telemetry] : active.rank_telemetry) {
    telemetry.overlap_ratio.reset();
    telemetry.bubble_ratio.reset();
    telemetry.idle_ratio.reset();
    telemetry.memory.reset();
  }

  const v1::Job& job = active.job;
  for (int i = 0; i < job.placements_size(); ++i) {
    const v1::Placement& p = job.placements(i);
    v1::CoordinatorMessage message;
    v1::Assignment* a = message.mutable_assign();
    a->set_job(job.name());
    a->set_generation(job.generation());
    *a->mutable_spec() = job.spec();
    *a->mutable_layout() = job.layout();
    a->set_world_size(active.world_size);
    for (int j = 0; j < p.ranks_size() && j < p.device_indices_size(); ++j) {
      v1::RankAssignment* r = a->add_ranks();
      r->set_rank(p.ranks(j));
      r->set_local_rank(j);
      r->set_device_index(p.device_indices(j));
      r->set_device_kind(active.kind);
    }
    a->set_rendezvous_address(rendezvous_address_);
    if (options_.rendezvous_secret) {
      a->set_rendezvous_secret(options_.rendezvous_secret(job.name(), job.generation()));
    }
    a->set_num_nodes(job.placements_size());
    a->set_node_rank(i);
    if (!nodes_.Send(p.node(), message)) {
      // The node's session is gone; its reconnect (hello without this gang) or its timeout
      // fails the gang over.
      LOOM_LOG(WARNING) << "no session to send " << job.name() << " to " << p.node();
    }
  }
  LOOM_LOG(INFO) << "scheduled " << job.name() << " generation " << job.generation() << ": "
                 << reason;
}

void JobManager::SendCancelLocked(const std::vector<std::string>& node_names,
                                  const std::string& job, int64_t generation,
                                  const std::string& reason, bool checkpoint) {
  v1::CoordinatorMessage message;
  message.mutable_cancel()->set_job(job);
  message.mutable_cancel()->set_generation(generation);
  message.mutable_cancel()->set_reason(reason);
  message.mutable_cancel()->set_checkpoint(checkpoint);
  for (const std::string& node : node_names) nodes_.Send(node, message);
}

void JobManager::FailGangLocked(ActiveJob& active, bool retryable, const std::string& what) {
  const std::string name = active.job.name();
  const std::vector<std::string> nodes = PlacementNodes(active.job);
  const int64_t generation = active.job.generation();
  v1::Job updated = active.job;
  updated.clear_placements();
  absl::Status status;
  std::string reason;
  const int max_restarts = updated.spec().restart().max_restarts();
  if (retryable && StateAfterRetryableFailure(updated) == v1::RESTARTING) {
    v1::Job next = updated;
    next.set_restart_count(next.restart_count() + 1);
    const absl::Duration backoff = RestartBackoff(next);
    reason = absl::StrCat(what, "; restarting in ", absl::FormatDuration(backoff), " (restart ",
                          next.restart_count(), " of ", max_restarts, ")");
    status = TransitionLocked(active, std::move(updated), v1::RESTARTING, reason);
    if (status.ok()) {
      active.restart_at = clock_->Now() + backoff;
      active.ready_since = active.restart_at;
    }
  } else {
    reason = retryable ? absl::StrCat(what, "; restarts exhausted (", updated.restart_count(),
                                      " of ", max_restarts, ")")
                       : what;
    status = TransitionLocked(active, std::move(updated), v1::FAILED, reason);
  }
  if (!status.ok()) {
    LOOM_LOG(ERROR) << "cannot record the failure of " << name << ": " << status;
    return;
  }
  LOOM_LOG(INFO) << name << " generation " << generation << " failed: " << reason;
  SendCancelLocked(nodes, name, generation, absl::StrCat("gang stopped: ", what));
}

void JobManager::RequeueGangLocked(ActiveJob& active, const std::string& what, absl::Duration delay,
                                   bool checkpoint) {
  const std::string name = active.job.name();
  const std::vector<std::string> nodes = PlacementNodes(active.job);
  const int64_t generation = active.job.generation();
  std::set<std::pair<std::string, int>> leaving;
  if (checkpoint) {
    for (const v1::Placement& p : active.job.placements()) {
      for (int rank : p.ranks()) {
        if (!active.succeeded_ranks.contains(rank)) leaving.insert({p.node(), rank});
      }
    }
  }
  v1::Job updated = active.job;
  updated.clear_placements();
  absl::Status status = TransitionLocked(
      active, std::move(updated), v1::RESTARTING,
      absl::StrCat(what, "; back to the queue (not counted as a restart)"), RestartCharge::kFree);
  if (!status.ok()) {
    LOOM_LOG(ERROR) << "cannot re-queue " << name << ": " << status;
    return;
  }
  active.restart_at = clock_->Now() + delay;
  active.ready_since = active.restart_at;
  active.leaving_generation = generation;
  active.leaving_ranks = std::move(leaving);
  LOOM_LOG(INFO) << name << " generation " << generation << " re-queued: " << what;
  SendCancelLocked(nodes, name, generation, absl::StrCat("gang moved: ", what), checkpoint);
}

void JobManager::NoteLeavingExitLocked(const std::string& node, const v1::RankStatus& status) {
  auto it = active_.find(status.job());
  if (it == active_.end()) return;
  ActiveJob& active = *it->second;
  if (active.leaving_ranks.empty() || active.leaving_generation != status.generation()) return;
  active.leaving_ranks.erase({node, status.rank()});
  if (!active.leaving_ranks.empty()) return;
  const absl::Time now = clock_->Now();
  if (active.job.state() != v1::RESTARTING || active.restart_at <= now) return;
  LOOM_LOG(INFO) << status.job() << " generation " << status.generation()
                 << ": every rank has exited; placing it again now";
  active.restart_at = now;
  active.ready_since = now;
  ScheduleLocked();
}

}  // namespace loom::jobs
