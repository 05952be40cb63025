// ScaleTestManager: loomd's scaling sweeps (issue 12, part 5). A sweep runs short copies of a
// job through the real scheduler, one size at a time: each copy is an ordinary job of the
// caller's tenant (JobManager::CreateJob, Job.scale_test naming the sweep), created once the
// previous size is measured. The ranks' step reports of the running copy (JobManager's step
// observer) fill a telemetry window; when the copy succeeds its medians after warm-up become the
// size's point (attribution.h). After the last size the sweep is attributed, SCALING findings
// are raised, loom_scaling_efficiency_ratio is set, and the sweep SUCCEEDS. A copy that fails or
// is cancelled fails the sweep, naming the size; a cancelled sweep cancels its running copy.
//
// Durability: every change is written to the ScaleTestStore before it is acted on. The step
// reports are kept in memory only, so a loomd restart cannot finish a sweep in progress: at
// start-up a RUNNING sweep is marked FAILED with the reason (never silently lost) and its copy,
// still running, is cancelled.
//
// Threading: thread-safe. op_mu_ serialises the operations that change sweeps (create, cancel,
// tick) and may be held while calling the JobManager; data_mu_ guards the in-memory state and
// is never held across a JobManager call, because the JobManager calls OnStep under its own
// lock (lock order: op_mu_, then the JobManager's, then data_mu_).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "loom/v1/scaling.pb.h"
#include "server/doctor/telemetry_window.h"
#include "server/jobs/job_manager.h"
#include "server/metrics/server_metrics.h"
#include "server/scaling/scale_test_store.h"

namespace loom::scaling {

class ScaleTestManager {
 public:
  // Recovers the store's sweeps (RUNNING ones fail, see above; the latest SUCCEEDED sweep of
  // each job name sets the metric). Pointers must outlive the manager; `metrics` may be null.
  static absl::StatusOr<std::unique_ptr<ScaleTestManager>> Create(
      ScaleTestStore* store, jobs::JobManager* jobs, const Clock* clock,
      server_metrics::ServerMetrics* metrics);
  ~ScaleTestManager();
  ScaleTestManager(const ScaleTestManager&) = delete;
  ScaleTestManager& operator=(const ScaleTestManager&) = delete;

  // Validates the request (devices, steps, the spec at every size as CreateJob would) and
  // stores a RUNNING sweep owned by `tenant`, whose first copy is created at once. A request_id
  // used before by the same tenant returns that sweep.
  absl::StatusOr<v1::ScaleTest> CreateScaleTest(const v1::CreateScaleTestRequest& request,
                                                const std::string& tenant);
  // INVALID_ARGUMENT for a malformed name, NOT_FOUND when unknown.
  absl::StatusOr<v1::ScaleTest> GetScaleTest(const std::string& name);
  absl::StatusOr<v1::ListScaleTestsResponse> ListScaleTests(
      const v1::ListScaleTestsRequest& request, const std::optional<std::string>& tenant);
  // FAILED_PRECONDITION for a sweep that has ended.
  absl::StatusOr<v1::ScaleTest> CancelScaleTest(const std::string& name);

  // The JobManager's step observer: keeps the report when it is about a running copy.
  void OnStep(const v1::StepReport& report);
  // Advances every running sweep (sweep.h's NextAction). loomd calls it from the ticker.
  void Tick();
  void StartTicker(absl::Duration interval);
  void Shutdown();

 private:
  struct Running {
    v1::ScaleTest test;
    doctor::TelemetryWindow window;  // the current copy's reports
    int64_t generation = -1;         // of the reports in `window`
  };

  ScaleTestManager(ScaleTestStore* store, jobs::JobManager* jobs, const Clock* clock,
                   server_metrics::ServerMetrics* metrics)
      : store_(store), jobs_(jobs), clock_(clock), metrics_(metrics) {}
  absl::Status Recover();
  // One step of the sweep `name`'s state machine; returns whether it changed. Requires op_mu_.
  bool AdvanceOne(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  // Writes `test` (update_time set) and installs it in memory, or removes it from memory when
  // terminal. Requires op_mu_.
  absl::Status Commit(v1::ScaleTest test) ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  // Ends `test` with `state` and `reason` and commits it. Requires op_mu_.
  void End(v1::ScaleTest test, v1::ScaleTestState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_);
  void PublishMetric(const v1::ScaleTest& test);

  ScaleTestStore* const store_;
  jobs::JobManager* const jobs_;
  const Clock* const clock_;
  server_metrics::ServerMetrics* const metrics_;

  absl::Mutex op_mu_;
  absl::BitGen id_gen_ ABSL_GUARDED_BY(op_mu_);
  absl::Mutex data_mu_ ABSL_ACQUIRED_AFTER(op_mu_);
  std::map<std::string, Running> running_ ABSL_GUARDED_BY(data_mu_);     // by sweep name
  std::map<std::string, std::string> copies_ ABSL_GUARDED_BY(data_mu_);  // copy job -> sweep

  absl::Notification stop_;
  std::thread ticker_;
};

// Parses "scaletests/{id}"; INVALID_ARGUMENT naming `field` otherwise.
absl::StatusOr<std::string> ParseScaleTestName(const std::string& name,
                                               const std::string& field = "name");

// The `job` label of a sweep's loom_scaling_efficiency_ratio series: spec.name (or "job"),
// prefixed "TENANT/" for a tenant other than the default one, so that two tenants' sweeps of
// jobs with the same name keep their own series.
std::string ScalingMetricJob(const v1::ScaleTest& test);

}  // namespace loom::scaling
