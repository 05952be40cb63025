// JobManager: the owner of loomd's live state. It holds the in-memory view of every active job
// and every node (rebuilt from the store at start-up), decides every state change, and drives
// the workers through their sessions.
//
// Invariants:
//  - Write-ahead: every change of a job or node is written to the store first; only when the
//    write succeeds are memory, workers and watchers updated. A store error leaves memory as it
//    was and is returned (or logged, for changes triggered by workers and timers, which are
//    retried by the next report or tick).
//  - A job's state changes only through jobs::Transition().
//  - A device is allocated to at most one job; a job in SCHEDULED or RUNNING holds exactly the
//    devices of its placements, every other job holds none.
//  - Reports from workers carry (job, generation); anything not about the current generation of
//    an active job placed on that node is ignored, and the worker is told to cancel it.
//
// Scheduling runs after every change that can free devices or add work (job created, node
// registered or reconnected, gang stopped, backoff expired): a snapshot of the ready nodes and
// the queue goes to the pure scheduler::Schedule(), and each placement becomes SCHEDULED with
// generation + 1 and an Assignment on the session of every node of the gang.
//
// Time comes from the injected Clock. Tick() handles everything that happens because time
// passes (heartbeat timeouts, restart backoff, throttled progress writes); loomd calls it from a
// background thread (StartTicker), tests call it after FakeClock::Advance.
//
// Threading: thread-safe; one mutex (mu_) guards all state, including the NodeRegistry. Store
// writes happen under mu_ (which orders them), so store calls must not call back into the
// manager. Sessions are sent to under mu_ and must not block (SessionSink contract). Log
// appends and rendezvous traffic do not take mu_ except for short lookups.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"
#include "server/auth/principal.h"
#include "server/calibration/calibrator.h"
#include "server/doctor/finding_tracker.h"
#include "server/doctor/goodput.h"
#include "server/doctor/rules.h"
#include "server/doctor/telemetry_window.h"
#include "server/jobs/job_state_machine.h"
#include "server/jobs/job_watchers.h"
#include "server/jobs/log_store.h"
#include "server/jobs/step_time_window.h"
#include "server/jobs/trace_collector.h"
#include "server/metrics/server_metrics.h"
#include "server/nodes/node_registry.h"
#include "server/rendezvous/rendezvous_store.h"
#include "server/store/job_store.h"

namespace loom::jobs {

// A spec as accepted: defaults filled in and the layout resolved.
struct AcceptedSpec {
  v1::JobSpec spec;
  v1::Layout layout;
};

// Validates a user's spec against the devices of the READY nodes. Errors are INVALID_ARGUMENT
// or FAILED_PRECONDITION naming the field and the fix. Bound to ValidateJobSpec in loomd
// (default_spec_validator.h); injectable so the manager can be tested on its own.
using SpecValidator =
    std::function<absl::StatusOr<AcceptedSpec>(const v1::JobSpec&, const nodes::Capacity&)>;

struct JobManagerOptions {
  // host:port that ranks use for the RendezvousService (loomd's --advertise). Nothing is
  // scheduled while it is empty (see SetRendezvousAddress).
  std::string rendezvous_address;
  // The secret a gang's ranks present to the RendezvousService (auth/rendezvous_secrets.h), put
  // into every Assignment; empty function: none.
  std::function<std::string(const std::string& job, int64_t generation)> rendezvous_secret;
  // How often workers heartbeat (sent to them) and how long a silent node stays READY.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration node_timeout = absl::Seconds(10);
  // Progress is written to the store at most this often per job (and on every state change).
  absl::Duration progress_persist_interval = absl::Seconds(1);
  // After a hello that does not list a gang loomd placed on that node, how long the worker has
  // to prove it alive or finished (it re-sends its last exit reports right after hello) before
  // the gang fails over.
  absl::Duration reconcile_grace = absl::Seconds(3);

  // ---- Watchdogs (job_manager_watchdogs.cc) ----
  // Progress: a RUNNING gang is hung when one of its ranks reported no progress (a step of its
  // own, or a checkpoint written by any rank: the others wait for it) for
  // max(progress_timeout_floor, progress_timeout_factor x the median step time of the generation),
  // or, before its first step, for startup_allowance after it started (model set-up, data,
  // rendezvous and checkpoint loading). A hung gang's workers are asked to dump every rank's stacks
  // (DumpStacks); after stack_dump_grace, or once every rank answered, the gang stops and restarts
  // as after a crash (a retryable failure) with the dumps summarised in the event and written in
  // full to the job's logs. A zero floor turns the watchdog off.
  absl::Duration progress_timeout_floor = absl::Minutes(5);
  double progress_timeout_factor = 20;
  absl::Duration startup_allowance = absl::Minutes(15);
  absl::Duration stack_dump_grace = absl::Seconds(3);
  // Start: a SCHEDULED gang whose ranks have not all started after start_timeout is re-placed
  // (not charged to max_restarts), avoiding the nodes that did not start their ranks. Zero: off.
  absl::Duration start_timeout = absl::Minutes(5);
  // A gang moved off a draining node waits this long before it is placed again, so that the
  // ranks on the node have the worker's stop grace to checkpoint and exit first.
  absl::Duration drain_requeue_delay = absl::Seconds(10);
  // GetJobTrace waits at most this long for every node of the gang to send its ranks' trace
  // events; the nodes still silent are named in JobTrace.missing_nodes.
  absl::Duration trace_wait = absl::Seconds(5);

  // ---- Nodes ----
  nodes::DeviceLimits device_limits;

  // ---- Store safety (server/store/state_dir_guard.h) ----
  // loomd started on a lost database over a state directory that held jobs (--start-fresh):
  // gangs that workers report and the store does not know are quarantined (left running,
  // listed in Node.quarantined, counted by loom_quarantined_gangs) instead of cancelled.
  bool quarantine_unknown_gangs = false;
  // Called (under the manager's lock, once per manager) after the first job is stored: loomd
  // writes the state directory's marker. May be empty.
  std::function<void()> on_first_job;
};

class JobManager {
 public:
  // Rebuilds the in-memory view from `store` (active jobs, known nodes; every known node gets
  // the node timeout from now to reconnect). Every pointer must outlive the manager;
  // `metrics`, `rendezvous` and `calibrator` may be null. With a `calibrator`, every job that
  // SUCCEEDED with a plan and a measured step time is learnt from, and PlanJob and CreateJob
  // with `auto` plan with its calibration; without, with the catalog's efficiency table.
  static absl::StatusOr<std::unique_ptr<JobManager>> Create(
      store::JobStore* store, const Clock* clock, SpecValidator validator, LogStore* logs,
      rendezvous::RendezvousStore* rendezvous, server_metrics::ServerMetrics* metrics,
      JobManagerOptions options, calibration::Calibrator* calibrator = nullptr);
  ~JobManager();
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // ---- Jobs (JobService) ----

  // Validates and stores a new QUEUED job owned by `tenant`, then schedules. A request with
  // spec_yaml is converted first (common/spec_yaml.h; its errors are INVALID_ARGUMENT naming the
  // line and key) and is then the request with that spec. A non-empty
  // request_id already used by the same tenant returns the job created with it (no second job)
  // when the spec is the same (once defaults are filled), and ALREADY_EXISTS when it differs;
  // request ids of different tenants never meet. After validation, FAILED_PRECONDITION for a
  // job the planner's memory model says cannot fit the devices (memory_fit.h) and for sharded
  // checkpoints that would land on several nodes (checkpoint_placement.h). Malformed input
  // writes nothing.
  // `scale_test`: the sweep ("scaletests/{id}") a copy is made for (Job.scale_test); empty for
  // users' jobs.
  absl::StatusOr<v1::Job> CreateJob(const v1::CreateJobRequest& request,
                                    const std::string& tenant = auth::kDefaultTenant,
                                    const std::string& scale_test = "");
  // Validates `spec` as CreateJob does first (the validator against the READY nodes' devices),
  // writing nothing; for callers that create jobs later (scaling sweeps).
  absl::StatusOr<AcceptedSpec> ValidateSpec(const v1::JobSpec& spec);
  // The devices of the READY nodes.
  nodes::Capacity ReadyCapacity();
  // Called with every step report accepted for the current generation of an active job (after
  // the doctor's window took it), under the manager's lock: it must not block nor call back
  // into the manager. Set once, before serving (loomd: the scaling sweeps' measurements).
  void SetStepObserver(std::function<void(const v1::StepReport&)> observer) {
    step_observer_ = std::move(observer);
  }
  // The job with its event log. INVALID_ARGUMENT for a malformed name, NOT_FOUND if unknown.
  absl::StatusOr<v1::Job> GetJob(std::string_view name);
  // A page of jobs, oldest first (see ListJobsRequest), only `tenant`'s when given;
  // INVALID_ARGUMENT for a bad page_size or page_token.
  absl::StatusOr<v1::ListJobsResponse> ListJobs(
      const v1::ListJobsRequest& request, const std::optional<std::string>& tenant = std::nullopt);
  // Moves a non-terminal job to CANCELLED and cancels its ranks on every node;
  // FAILED_PRECONDITION for a terminal job.
  absl::StatusOr<v1::Job> CancelJob(std::string_view name);
  // A subscription whose first update is the job as it is now (see JobWatchers).
  absl::StatusOr<std::shared_ptr<JobSubscription>> WatchJob(std::string_view name);
  // Ranks the layouts of a spec on the live cluster (or the request's cluster description);
  // see planner_service::PlanJob. Writes nothing.
  absl::StatusOr<v1::PlanJobResponse> PlanJob(const v1::PlanJobRequest& request);
  // Whether the job is terminal (for log followers). Errors as GetJob.
  absl::StatusOr<bool> IsJobFinished(std::string_view name);

  // ---- Nodes (NodeService) ----

  // Validates and stores the node (READY; a known node gets its inventory replaced), then
  // schedules. ALREADY_EXISTS while the node id is live (a session open and heard from within the
  // node timeout): a second worker cannot take over a running node's id.
  absl::StatusOr<v1::RegisterNodeResponse> RegisterNode(const v1::RegisterNodeRequest& request);
  // Every node. `with_quarantined` false (a caller who is not an admin) leaves out
  // Node.quarantined: those gangs are named by job, and loomd does not know whose they are.
  v1::ListNodesResponse ListNodes(bool with_quarantined = true);
  // Marks the node draining (or not, with drain = false): nothing new is placed on it. With
  // move_jobs its gangs are stopped and re-queued without spending restarts; with
  // stop_quarantined its quarantined gangs are cancelled. INVALID_ARGUMENT for a malformed
  // name, NOT_FOUND for an unknown node.
  absl::StatusOr<v1::Node> DrainNode(const v1::DrainNodeRequest& request);
  // Forgets the node (store and memory) so that its devices stop counting. FAILED_PRECONDITION
  // while it is READY or runs a gang, unless force (its gangs are then re-queued without
  // spending restarts and its session is closed). Errors as DrainNode.
  absl::Status DeleteNode(const v1::DeleteNodeRequest& request);

  // Starts a session for the node of `hello` (which must be registered), replacing an earlier one
  // only when that one is no longer live (ALREADY_EXISTS otherwise), and reconciles what the worker
  // runs with the store (see the .cc). Returns the session id to pass to the calls below.
  // FAILED_PRECONDITION for an unregistered node.
  absl::StatusOr<uint64_t> OpenSession(const v1::SessionHello& hello,
                                       std::shared_ptr<nodes::SessionSink> sink);
  // Handles one message of an open session. FAILED_PRECONDITION when the session was replaced
  // or closed (the adapter then ends the stream); a malformed message is INVALID_ARGUMENT and
  // the session continues. Never crashes on any input.
  absl::Status HandleWorkerMessage(std::string_view node_id, uint64_t session_id,
                                   const v1::WorkerMessage& message);
  // Ends the session if it is still the node's current one. The node stays READY until the
  // node timeout passes without a new session.
  void CloseSession(std::string_view node_id, uint64_t session_id);

  // ---- Rendezvous ----

  // The scope checker for RendezvousStore: OK when `job` is active at `generation`.
  absl::Status CheckRendezvousScope(std::string_view job, int64_t generation);

  // Sets the address sent to ranks in assignments; loomd learns it only after binding a port
  // 0 listener, so scheduling waits for it. Then schedules.
  void SetRendezvousAddress(std::string address);

  // ---- Time ----

  // Marks silent nodes LOST (failing over their jobs), re-queues jobs whose backoff expired,
  // persists throttled progress, and schedules.
  void Tick();
  // Calls Tick() every `interval` on a background thread until Shutdown().
  void StartTicker(absl::Duration interval);
  // Stops the ticker, closes every watcher and session. Idempotent.
  void Shutdown();

  // ---- Telemetry ----

  server_metrics::Snapshot MetricsSnapshot();
  // The latest StepReport of each rank of the job's current generation (for later telemetry).
  std::map<int, v1::StepReport> LatestSteps(std::string_view name);

  // ---- The doctor (job_manager_doctor.cc) ----

  // The doctor's report of the job's current generation: raised findings, pending ones, per
  // stage and per rank medians. A job that is not active (or not judged yet) gets an empty
  // report with a note. Errors as GetJob.
  absl::StatusOr<v1::JobReport> GetJobReport(std::string_view name);

  // New steps of rank 0 between two doctor windows: the doctor judges a running job on the
  // tick once rank 0 has reported this many steps since its last window.
  static constexpr int64_t kDoctorWindowSteps = 4;
  // The closed loop: re-splits per job at most, windows of the new generation measured before
  // judging one (the window then holds as many steps as the one before), and the least step
  // time it must save to stay.
  static constexpr int kMaxRebalances = 2;
  static constexpr int kRebalanceVerifyWindows = 4;
  static constexpr double kRebalanceMinGain = 0.03;

  // ---- Timelines (job_manager_trace.cc) ----

  // Every rank's phases over a step range of a RUNNING job, read from the ranks' trace rings
  // through their workers (see TraceCollector for the bounds). INVALID_ARGUMENT for a bad name
  // or range (ValidateTraceSteps), NOT_FOUND for an unknown job, FAILED_PRECONDITION for a job
  // that is not RUNNING (or, for the default range, has reported no step yet),
  // RESOURCE_EXHAUSTED when too many requests are in flight. Blocks up to trace_wait.
  absl::StatusOr<v1::JobTrace> GetJobTrace(const v1::GetJobTraceRequest& request);
  // The most steps one GetJobTrace covers, the steps of the default range (both 0: the last
  // ones rank 0 reported), and the most events loomd keeps per request.
  static constexpr int64_t kMaxTraceSteps = 64;
  static constexpr int64_t kDefaultTraceSteps = 8;
  static constexpr size_t kMaxTraceEvents = size_t{1} << 20;

 private:
  // Everything the manager knows about a job that is not terminal.
  struct ActiveJob {
    int64_t sequence = 0;
    v1::Job job;  // as stored, plus progress newer than the last throttled write
    v1::DeviceKind kind = v1::DEVICE_KIND_CPU;
    int world_size = 1;
    int tensor = 1;
    absl::Time ready_since;  // when the job last became eligible for scheduling
    absl::Time restart_at;   // RESTARTING: the end of the backoff
    // A gang re-queued with its work kept (RequeueGangLocked with `checkpoint`): the (node, rank)
    // of generation `leaving_generation` that have not reported their exit yet. Once they all
    // have, the job is placed again without waiting for the rest of its delay (restart_at stays
    // the cap, for ranks on a node that is gone).
    int64_t leaving_generation = 0;
    std::set<std::pair<std::string, int>> leaving_ranks;
    std::string waiting_reason;  // QUEUED: the scheduler's last word (memory only)
    // The current generation's gang, as reported by the workers.
    std::set<int> running_ranks;
    std::set<int> succeeded_ranks;
    std::map<int, v1::StepReport> latest_steps;
    // Nodes whose hello did not list this gang, and when the grace for them ends.
    std::map<std::string, absl::Time> missing_on;
    // Progress: throttled writes and the rate behind the ETA.
    bool progress_dirty = false;
    absl::Time last_progress_write;
    int64_t rate_start_step = -1;
    absl::Time rate_start_time;
    // Rank 0's measured step times of the current generation (job.plan_check and the
    // loom_job_step_seconds gauge; memory only, measured afresh after a loomd restart).
    StepTimeWindow step_times;
    // Per-rank ratios and memory (current generation), comm bytes and device allocations
    // (whole job) for the loom_rank_* and loom_gpu_* series; memory only.
    std::map<int, server_metrics::RankTelemetry> rank_telemetry;
    // rank -> the last step of the current generation whose comm bytes and device allocations
    // were counted, so that a report sent twice (a worker replaying after a reconnect) is not
    // counted twice.
    std::map<int, int64_t> counted_steps;
    // Whether rank 0's first step of the current gang was compared with what earlier gangs
    // reached (checkpoint_placement.h ResumeNotice); reset at each launch.
    bool resume_checked = false;
    // Watchdogs (memory only: after a loomd restart the clocks start afresh).
    absl::Time scheduled_at;     // when the current generation was placed
    absl::Time last_progress;    // when the current generation started RUNNING
    absl::Time last_checkpoint;  // the last checkpoint report of any rank (all ranks wait)
    std::map<int, absl::Time> rank_progress;  // each rank's last step report
    bool stepped = false;                     // the current generation reported a step
    // Set when the progress watchdog fired: the gang stops at this time (after the dumps).
    std::optional<absl::Time> hung_stop_at;
    std::string hung_reason;
    std::map<int, v1::StackDump> dumps;  // by rank, from the workers
    // Nodes that failed to prepare or to start this job: the scheduler avoids them for it until
    // they register again.
    std::set<std::string> avoid_nodes;
    // The doctor (memory only; reset at each launch): every rank's recent steps and block
    // costs, the findings' persistence, rank 0's step at the last window, the last report.
    doctor::TelemetryWindow doctor_window;
    // Goodput (server/doctor/goodput.h): fed by every commit and rank 0's reports; its snapshot
    // is written into job.goodput with each commit. `requeue_cause` says why the next
    // RESTARTING waits (the doctor sets kRebalance just before its re-queue).
    doctor::GoodputLedger goodput;
    doctor::WaitCause requeue_cause = doctor::WaitCause::kRestart;
    doctor::TrackerState doctor_state;
    int64_t doctor_step = -1;
    v1::JobReport doctor_report;
    // The planner's view for the LAYOUT and MEMORY rules, computed once per generation at the
    // first judged window (PlanDoctorAdviceLocked).
    // The closed loop (spec.rebalance.mode auto): kept across the job's generations.
    struct Rebalance {
      int changes = 0;         // re-splits made (bounded by kMaxRebalances)
      bool measuring = false;  // a re-split is being verified in the current generation
      double before_step = 0;  // rank 0's median step before it
      double predicted_step = 0;
      std::string before_idle;  // per-stage idle ratios before it, for the event
      std::vector<int> before, after;
    } rebalance;
    bool doctor_planned = false;
    std::optional<doctor::LayoutAdvice> doctor_layout;
    uint64_t doctor_device_memory = 0;
    std::vector<doctor::MicroBatchFit> doctor_fits;
  };

  // Records `notice` as an event of the job that changes no state (from_state == to_state).
  void AddNoticeLocked(ActiveJob& active, const std::string& notice)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // OK when `request` (whose request_id found `existing`) asks for the same spec; see CreateJob.
  // Thread-safe without mu_ (the validator is a pure function).
  absl::Status CheckSameRequest(const v1::CreateJobRequest& request, const v1::Job& existing);

  // Whether `job` is active in a gang state (SCHEDULED or RUNNING), which holds its devices.
  bool HoldsDevicesLocked(const std::string& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves a SCHEDULED job whose every rank has started to RUNNING. Requires mu_.
  void MaybeMarkRunningLocked(ActiveJob& active) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  JobManager(store::JobStore* store, const Clock* clock, SpecValidator validator, LogStore* logs,
             rendezvous::RendezvousStore* rendezvous, server_metrics::ServerMetrics* metrics,
             JobManagerOptions options, calibration::Calibrator* calibrator);
  absl::Status Restore();

  // How a commit reaches the disk and the watchers.
  enum class Commit {
    // Synced (store::Durability::kSynced), then published. Everything loomd acts on.
    kSynced,
    // Unsynced (kDeferred) and published at once: only what the workers tell loomd again after
    // a restart (a gang RUNNING, its progress).
    kDeferred,
    // Unsynced, and published only once a later synced commit (whose WAL sync takes every
    // earlier commit to disk) or SyncHeldLocked() has made it durable, before mu_ is released.
    // For a gang's successful end: the next gang's synced placement, which follows at once,
    // carries it, so the end and the placement cost one sync instead of two.
    kWithNextSync,
  };
  // Writes `updated` (and `event`) to the store, then installs it in memory, publishes it (see
  // Commit), and keeps allocations, metrics and rendezvous in step. On a terminal state the
  // job leaves the active set. Requires mu_.
  absl::Status CommitLocked(ActiveJob& active, v1::Job updated,
                            const std::optional<v1::JobEvent>& event,
                            Commit commit = Commit::kSynced) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Transition + commit. Requires mu_.
  absl::Status TransitionLocked(ActiveJob& active, v1::Job updated, v1::JobState to,
                                const std::string& reason,
                                RestartCharge charge = RestartCharge::kCharged,
                                Commit commit = Commit::kSynced) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the kWithNextSync commits still held durable (no synced commit followed them: the
  // last of them is written again, synced) and publishes them. Every path that commits
  // kWithNextSync calls it before releasing mu_. Requires mu_.
  void SyncHeldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes the held commits (they are durable now). Requires mu_.
  void PublishHeldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the scheduler and launches every placement. Requires mu_.
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a tick's scheduling pass could decide anything the last pass did not: pass_due_ (an
  // input changed), a RESTARTING job whose backoff ended since the last pass, or
  // kPassSafetyInterval since it (a pass is a pure function of the queue and the free devices,
  // so the same inputs give the same decision; the interval bounds what a missed trigger could
  // cost). O(gangs), never O(queue). Requires mu_.
  bool PassDueLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps gangs_ in step with a job whose state goes from `from` to `to` (JOB_STATE_UNSPECIFIED:
  // it enters or leaves the active set), and marks a pass due. Requires mu_.
  void IndexLocked(const std::string& name, ActiveJob* active, v1::JobState from, v1::JobState to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LaunchLocked(ActiveJob& active, const std::vector<v1::Placement>& placements,
                    const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops the gang of a running job after a failure (retryable: restart or FAILED when
  // exhausted; permanent: FAILED). Requires mu_.
  void FailGangLocked(ActiveJob& active, bool retryable, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops the gang and puts it back in the queue after `delay` without spending a restart
  // (it was not the job's fault: a draining node, a start timeout, a node that failed to
  // prepare it). With `checkpoint` the ranks save a checkpoint at a step they agree on before
  // they exit (CancelAssignment.checkpoint), which the next generation resumes from. Requires
  // mu_.
  void RequeueGangLocked(ActiveJob& active, const std::string& what, absl::Duration delay,
                         bool checkpoint = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An exit reported by `node`: when it is the last rank of a gang re-queued with its work kept,
  // the job becomes ready to be placed now. Requires mu_.
  void NoteLeavingExitLocked(const std::string& node, const v1::RankStatus& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends CancelAssignment for (job, generation) to each node named. Requires mu_.
  void SendCancelLocked(const std::vector<std::string>& node_names, const std::string& job,
                        int64_t generation, const std::string& reason, bool checkpoint = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleRankStatusLocked(const std::string& node, const v1::RankStatus& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // HandleRankStatusLocked, and whether the status made its gang leave its devices (so that a
  // scheduling pass may place a queued job). Requires mu_.
  bool HandleRankStatusFreesLocked(const std::string& node, const v1::RankStatus& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleStepLocked(const std::string& node, const v1::StepReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the doctor's rules over the job's window when rank 0 has moved kDoctorWindowSteps
  // steps since the last window; raised and cleared findings become job events. Requires mu_.
  void RunDoctorLocked(ActiveJob& active) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the planner (with this loomd's calibration) for the best layout of the job's model on
  // its devices and for the running layout's prediction and memory at a few micro-batch sizes;
  // once per generation. Requires mu_.
  void PlanDoctorAdviceLocked(ActiveJob& active) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // spec.rebalance.mode auto: applies a raised STAGE_IMBALANCE's split, or verifies (and rolls
  // back) the last one. Returns true when the gang was re-queued. Requires mu_.
  bool RebalanceLocked(ActiveJob& active, const doctor::Diagnosis& diagnosis)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps a step report's ratios and memory and (once per step) its comm bytes and device
  // allocations for the loom_rank_* and loom_gpu_* series. Requires mu_.
  void RecordRankTelemetry(ActiveJob& active, const v1::StepReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The active job that a report about (job, generation) from `node` refers to, or null when
  // the report is stale (then the worker is told to cancel unless `quiet`). Requires mu_.
  ActiveJob* CurrentGangLocked(const std::string& node, const std::string& job, int64_t generation,
                               bool quiet) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails over gangs whose node did not account for them within the reconcile grace.
  void CheckMissingLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ALREADY_EXISTS when the node has a live session (see RegisterNode); `field` names the
  // request field in the message. Requires mu_.
  absl::Status RefuseLiveNodeLocked(const std::string& node_name, absl::string_view field)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The watchdogs (job_manager_watchdogs.cc): progress and start timeouts. Require mu_.
  void CheckProgressLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckStartTimeoutsLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops a hung gang whose dumps are in (or whose grace ended), with their summary.
  void StopHungGangLocked(ActiveJob& active) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleStackDumpLocked(const std::string& node, const v1::StackDump& dump)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Node-level reports (job_manager_nodes.cc). Require mu_.
  void HandleWorkerDrainingLocked(const std::string& node, const v1::WorkerDraining& draining)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A rank status with prepare_error: the node is avoided for the job (and marked unhealthy
  // when its disk is full). Requires mu_.
  void NotePrepareFailureLocked(const std::string& node, ActiveJob& active,
                                const v1::RankStatus& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether (job, generation) is quarantined on the node; quarantines it when `add` and the
  // manager quarantines unknown gangs. Requires mu_.
  bool QuarantinedLocked(const std::string& node, const std::string& job, int64_t generation,
                         bool add) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the node's quarantines of gangs its worker no longer runs (`running`: its hello's
  // (job, generation) pairs) and stores the node when that changed it. Requires mu_.
  void ForgetEndedQuarantinesLocked(nodes::NodeEntry& entry,
                                    const std::set<std::pair<std::string, int64_t>>& running)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-queues (free) every gang with a rank on the node; its ranks checkpoint before they exit
  // (`delay` should cover the workers' stop grace). Requires mu_.
  void MoveGangsOffLocked(const std::string& node, const std::string& why, absl::Duration delay)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks nodes LOST whose last message is older than the node timeout. Requires mu_.
  void CheckNodesLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PersistNodeLocked(nodes::NodeEntry& entry, v1::NodeState state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job with progress from memory when active, else as stored.
  absl::StatusOr<v1::Job> LoadJob(std::string_view name);
  absl::StatusOr<v1::Job> LoadJobLocked(std::string_view name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Free devices of `kind` on schedulable nodes (with a session). Requires mu_.
  int FreeDevicesLocked(v1::DeviceKind kind) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends a worker's log lines to the job's log, only when `node` runs (or just ran) that
  // job's gang at chunk.generation and the lines name a rank (>= 0; -1 is loomd's own): a node
  // cannot write into other jobs' logs, nor use up their log quota.
  void AppendLogs(const std::string& node, const v1::LogChunk& chunk);
  // Remembers where `gang` (a job as it was in a gang state) ran, for its late log lines.
  void NoteEndedGangLocked(const v1::Job& gang) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  store::JobStore* const store_;
  const Clock* const clock_;
  const SpecValidator validator_;
  LogStore* const logs_;
  rendezvous::RendezvousStore* const rendezvous_;
  server_metrics::ServerMetrics* const metrics_;
  const JobManagerOptions options_;
  calibration::Calibrator* const calibrator_;  // may be null

  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<ActiveJob>, std::less<>> active_ ABSL_GUARDED_BY(mu_);
  // Why gangs_ and pass_due_: a sweep of thousands of jobs waiting behind a busy cluster made
  // every 100 ms tick walk the whole queue under mu_ (the watchdogs, the progress writes, the
  // doctor and a scheduling pass that could place nothing): 14.5-18 ms per tick with 10,000 jobs
  // queued (queue_depth_bench), 78 % of a core for a loomd at rest with 5,000.
  // Invariant (IndexLocked): gangs_ holds exactly the active jobs in SCHEDULED, RUNNING or
  // RESTARTING, pointing into active_.
  std::map<std::string, ActiveJob*, std::less<>> gangs_ ABSL_GUARDED_BY(mu_);
  // Something a pass reads changed since the last pass: a transition other than a gang's
  // SCHEDULED -> RUNNING, a node's state, a create that skipped its pass (its waiting reason is
  // still unwritten), or a launch of the last pass that failed (retried by the next tick).
  bool pass_due_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_pass_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  static constexpr absl::Duration kPassSafetyInterval = absl::Seconds(10);
  nodes::NodeRegistry nodes_ ABSL_GUARDED_BY(mu_);
  std::string rendezvous_address_ ABSL_GUARDED_BY(mu_);
  std::map<v1::JobState, int> state_counts_ ABSL_GUARDED_BY(mu_);  // every job in the store
  // Stale (node, job, generation) gangs already told to cancel on the node's current session,
  // so that a stale gang's stream of reports does not become a stream of cancels.
  std::set<std::string> stale_cancelled_ ABSL_GUARDED_BY(mu_);
  // "node|job|generation" of the gangs that left their devices most recently (at most
  // kEndedGangsKept, oldest forgotten first): their workers may still flush the ranks' last log
  // lines, which AppendLogs accepts only from a node that ran the gang.
  std::set<std::string> ended_gangs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> ended_gang_order_ ABSL_GUARDED_BY(mu_);
  absl::BitGen id_gen_ ABSL_GUARDED_BY(mu_);           // the random part of job ids
  bool first_job_noted_ ABSL_GUARDED_BY(mu_) = false;  // on_first_job was called
  JobWatchers watchers_;
  // kWithNextSync commits not yet known durable, oldest first, with whether each was a state
  // change; published by the next synced commit or SyncHeldLocked(). Empty whenever mu_ is free.
  std::vector<std::pair<v1::Job, bool>> held_publications_ ABSL_GUARDED_BY(mu_);
  std::function<void(const v1::StepReport&)> step_observer_;  // set before serving
  TraceCollector traces_;  // its own lock (see trace_collector.h)
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;

  absl::Notification stop_ticker_;
  std::thread ticker_;
};

// OK for a GetJobTrace step range: both 0 (the latest steps), or 1 <= first <= last with at most
// JobManager::kMaxTraceSteps steps; INVALID_ARGUMENT naming first_step / last_step otherwise.
absl::Status ValidateTraceSteps(int64_t first_step, int64_t last_step);

// Parses "jobs/{job}" and returns {job}; INVALID_ARGUMENT "name must look like jobs/{job} ..."
// for anything else. `field` names the request field in the message.
absl::StatusOr<std::string> ParseJobName(std::string_view name, std::string_view field = "name");

}  // namespace loom::jobs
