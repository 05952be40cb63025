#include "server/scaling/scale_test_manager.h"

#include <google/protobuf/util/time_util.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/auth/principal.h"
#include "server/jobs/job_manager_helpers.h"
#include "server/scaling/attribution.h"
#include "server/scaling/sweep.h"
#include "server/store/job_store.h"

namespace loom::scaling {
namespace {

constexpr char kPrefix[] = "scaletests/";
constexpr char kPageTokenPrefix[] = "loom-scale-page-v1";

using jobs::internal::ToProto;

int WorldSize(const v1::Layout& layout) {
  return std::max(1, layout.data()) * std::max(1, layout.tensor()) * std::max(1, layout.pipeline());
}

bool JobTerminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

}  // namespace

absl::StatusOr<std::string> ParseScaleTestName(const std::string& name, const std::string& field) {
  const std::string id = name.substr(std::min(name.size(), sizeof(kPrefix) - 1));
  bool ok = absl::StartsWith(name, kPrefix) && !id.empty() && id.size() <= 63;
  for (char c : id) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-');
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " must look like scaletests/{id} (got \"", absl::CHexEscape(name.substr(0, 80)),
        "\"); use the name CreateScaleTest or ListScaleTests returned"));
  }
  return id;
}

absl::StatusOr<std::unique_ptr<ScaleTestManager>> ScaleTestManager::Create(
    ScaleTestStore* store, jobs::JobManager* jobs, const Clock* clock,
    server_metrics::ServerMetrics* metrics) {
  std::unique_ptr<ScaleTestManager> m(new ScaleTestManager(store, jobs, clock, metrics));
  RETURN_IF_ERROR(m->Recover());
  jobs->SetStepObserver([self = m.get()](const v1::StepReport& r) { self->OnStep(r); });
  return m;
}

ScaleTestManager::~ScaleTestManager() { Shutdown(); }

absl::Status ScaleTestManager::Recover() {
  absl::MutexLock op(&op_mu_);
  ASSIGN_OR_RETURN(std::vector<StoredScaleTest> running, store_->ListRunning());
  for (StoredScaleTest& stored : running) {
    v1::ScaleTest& t = stored.test;
    const int index = CurrentIndex(t);
    std::string where = "before its first copy";
    bool cancel_ok = false;
    if (index >= 0) {
      const v1::ScalePoint& p = t.points(index);
      where = absl::StrCat("at ", p.devices(), " devices");
      if (!p.job().empty()) {
        absl::StatusOr<v1::Job> copy = jobs_->GetJob(p.job());
        const bool cancel = copy.ok() && !JobTerminal(copy->state());
        if (cancel) cancel_ok = jobs_->CancelJob(p.job()).ok();
        absl::StrAppend(&where, " (copy ", p.job(), cancel && cancel_ok ? ", cancelled" : "", ")");
      }
    }
    End(std::move(t), v1::SCALE_TEST_FAILED,
        absl::StrCat("loomd restarted while the sweep ran ", where,
                     "; the copies' step reports are kept in memory only, so the sweep cannot "
                     "continue: run it again (loomctl scale-test)"));
  }
  // The metric: the latest finished sweep of each job name.
  std::map<std::string, v1::ScaleTest> latest;
  int64_t after = 0;
  while (true) {
    ASSIGN_OR_RETURN(ScaleTestPage page, store_->List(after, 500, std::nullopt));
    for (StoredScaleTest& s : page.tests) {
      after = s.sequence;
      if (s.test.state() == v1::SCALE_TEST_SUCCEEDED) latest[s.test.spec().name()] = s.test;
    }
    if (!page.has_more) break;
  }
  for (const auto& [job, test] : latest) PublishMetric(test);
  return absl::OkStatus();
}

absl::StatusOr<v1::ScaleTest> ScaleTestManager::CreateScaleTest(
    const v1::CreateScaleTestRequest& request, const std::string& tenant) {
  RETURN_IF_ERROR(store::CheckRequestId(request.request_id()));
  if (!request.has_spec()) {
    return absl::InvalidArgumentError("spec is required: the job to sweep (loomctl scale-test -f)");
  }
  RETURN_IF_ERROR(CheckSteps(request.steps()));
  const v1::JobSpec& base = request.spec();
  const bool gpus = base.resources().gpus() > 0;
  const nodes::Capacity capacity = jobs_->ReadyCapacity();
  RETURN_IF_ERROR(CheckDevices(request.devices(), gpus ? capacity.gpus : capacity.cpu_devices,
                               gpus ? "GPUs" : "CPU devices"));

  absl::MutexLock op(&op_mu_);
  const std::string request_key =
      request.request_id().empty() ? "" : store::RequestKey(tenant, request.request_id());
  ASSIGN_OR_RETURN(std::optional<StoredScaleTest> existing, store_->FindByRequestKey(request_key));
  if (existing.has_value()) {
    // A retry gets its sweep back; another request under the same key (or another tenant's
    // sweep) gets an error that names nothing of it.
    const v1::ScaleTest& found = existing->test;
    const bool same =
        store::SameTenant(found.tenant(), tenant) &&
        google::protobuf::util::MessageDifferencer::Equals(request.spec(), found.spec()) &&
        std::equal(request.devices().begin(), request.devices().end(), found.devices().begin(),
                   found.devices().end()) &&
        request.weak() == found.weak() &&
        (request.steps() > 0 ? request.steps() : kDefaultSteps) == found.steps();
    if (!same) {
      return absl::AlreadyExistsError(absl::StrCat(
          "request_id \"", absl::CHexEscape(request.request_id()),
          "\" was already used for another scale test; use a new request_id for a new sweep, or "
          "resend the same request to get that sweep back"));
    }
    return found;
  }

  const int64_t steps = request.steps() > 0 ? request.steps() : kDefaultSteps;
  // The first size fixes the batch: strong scaling keeps it, weak scales it with the devices.
  const int d0 = request.devices(0);
  int64_t base_tokens = 0;
  std::vector<v1::JobSpec> specs;
  for (int i = 0; i < request.devices_size(); ++i) {
    const int d = request.devices(i);
    const int64_t tokens = i == 0 ? base.train().global_batch_tokens()
                                  : (request.weak() ? base_tokens * d / d0 : base_tokens);
    absl::StatusOr<v1::JobSpec> spec = SpecForSize(base, d, steps, tokens);
    absl::StatusOr<jobs::AcceptedSpec> accepted =
        spec.ok() ? jobs_->ValidateSpec(*spec) : absl::StatusOr<jobs::AcceptedSpec>(spec.status());
    if (!accepted.ok()) {
      return absl::Status(
          accepted.status().code(),
          absl::StrCat("at ", d, " devices (devices[", i, "]): ", accepted.status().message()));
    }
    if (i == 0) base_tokens = accepted->spec.train().global_batch_tokens();
    specs.push_back(*std::move(spec));
  }

  const absl::Time now = clock_->Now();
  v1::ScaleTest t;
  t.set_name(absl::StrCat(kPrefix, jobs::internal::NewResourceId(now, id_gen_)));
  *t.mutable_spec() = base;
  *t.mutable_devices() = request.devices();
  t.set_weak(request.weak());
  t.set_steps(steps);
  t.set_warmup_steps(static_cast<int32_t>(WarmupSteps(steps)));
  t.set_state(v1::SCALE_TEST_RUNNING);
  t.set_state_reason(absl::StrCat("running ", request.devices_size(), " sizes one at a time"));
  t.set_tenant(tenant);
  t.set_request_id(request.request_id());
  *t.mutable_create_time() = ToProto(now);
  *t.mutable_update_time() = ToProto(now);
  t.set_efficiency_threshold(kScalingThreshold);
  for (int i = 0; i < request.devices_size(); ++i) {
    v1::ScalePoint* p = t.add_points();
    p->set_devices(request.devices(i));
    p->set_global_batch_tokens(specs[i].train().global_batch_tokens());
  }
  ASSIGN_OR_RETURN(const int64_t sequence, store_->Create(t, request_key));
  (void)sequence;
  {
    absl::MutexLock data(&data_mu_);
    running_[t.name()].test = t;
  }
  AdvanceOne(t.name());
  return GetScaleTest(t.name());
}

absl::StatusOr<v1::ScaleTest> ScaleTestManager::GetScaleTest(const std::string& name) {
  RETURN_IF_ERROR(ParseScaleTestName(name).status());
  {
    absl::MutexLock data(&data_mu_);
    auto it = running_.find(name);
    if (it != running_.end()) return it->second.test;
  }
  ASSIGN_OR_RETURN(StoredScaleTest stored, store_->Get(name));
  return stored.test;
}

absl::StatusOr<v1::ListScaleTestsResponse> ScaleTestManager::ListScaleTests(
    const v1::ListScaleTestsRequest& request, const std::optional<std::string>& tenant) {
  if (request.page_size() < 0 || request.page_size() > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be 0..1000 (got ", request.page_size(), "); 0 means 100"));
  }
  const int limit = request.page_size() == 0 ? 100 : request.page_size();
  int64_t after = 0;
  if (!request.page_token().empty()) {
    std::string decoded;
    std::vector<std::string> parts;
    if (absl::WebSafeBase64Unescape(request.page_token(), &decoded)) {
      parts = absl::StrSplit(decoded, ':');
    }
    if (parts.size() != 2 || parts[0] != kPageTokenPrefix || !absl::SimpleAtoi(parts[1], &after)) {
      return absl::InvalidArgumentError(
          "page_token is not a token from a previous ListScaleTests response; pass "
          "next_page_token unchanged, or omit it to start from the first page");
    }
  }
  ASSIGN_OR_RETURN(ScaleTestPage page, store_->List(after, limit, tenant));
  v1::ListScaleTestsResponse response;
  for (StoredScaleTest& s : page.tests) {
    absl::StatusOr<v1::ScaleTest> live = GetScaleTest(s.test.name());  // newest in memory
    *response.add_scale_tests() = live.ok() ? *std::move(live) : std::move(s.test);
  }
  if (page.has_more && !page.tests.empty()) {
    response.set_next_page_token(
        absl::WebSafeBase64Escape(absl::StrCat(kPageTokenPrefix, ":", page.tests.back().sequence)));
  }
  return response;
}

absl::StatusOr<v1::ScaleTest> ScaleTestManager::CancelScaleTest(const std::string& name) {
  RETURN_IF_ERROR(ParseScaleTestName(name).status());
  absl::MutexLock op(&op_mu_);
  ASSIGN_OR_RETURN(v1::ScaleTest t, GetScaleTest(name));
  if (IsTerminal(t.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        name, " has ended (", v1::ScaleTestState_Name(t.state()), "); nothing to cancel"));
  }
  const int index = CurrentIndex(t);
  std::string reason = "cancelled by a user";
  if (index >= 0 && !t.points(index).job().empty()) {
    const std::string& copy = t.points(index).job();
    absl::StatusOr<v1::Job> job = jobs_->CancelJob(copy);
    absl::StrAppend(&reason, "; its copy at ", t.points(index).devices(), " devices (", copy, ") ",
                    job.ok() ? "was cancelled" : "had already ended");
    if (job.ok()) t.mutable_points(index)->set_job_state(job->state());
  }
  End(t, v1::SCALE_TEST_CANCELLED, reason);
  return GetScaleTest(name);
}

void ScaleTestManager::OnStep(const v1::StepReport& report) {
  absl::MutexLock data(&data_mu_);
  auto copy = copies_.find(report.job());
  if (copy == copies_.end()) return;
  auto it = running_.find(copy->second);
  if (it == running_.end()) return;
  Running& r = it->second;
  if (report.generation() != r.generation) {
    // A copy re-placed (a drained node): measure its newest gang only.
    r.window.Reset();
    r.generation = report.generation();
  }
  r.window.Add(report);
}

void ScaleTestManager::Tick() {
  absl::MutexLock op(&op_mu_);
  std::vector<std::string> names;
  {
    absl::MutexLock data(&data_mu_);
    for (const auto& [name, r] : running_) names.push_back(name);
  }
  for (const std::string& name : names) {
    // A few steps per tick at most: create, measure, create the next.
    for (int i = 0; i < 4 && AdvanceOne(name); ++i) {
    }
  }
}

bool ScaleTestManager::AdvanceOne(const std::string& name) {
  v1::ScaleTest t;
  {
    absl::MutexLock data(&data_mu_);
    auto it = running_.find(name);
    if (it == running_.end()) return false;
    t = it->second.test;
  }
  std::optional<CopyView> view;
  const int index = CurrentIndex(t);
  if (index >= 0 && !t.points(index).job().empty()) {
    absl::StatusOr<v1::Job> job = jobs_->GetJob(t.points(index).job());
    if (job.ok()) {
      view = CopyView{job->state(), job->state_reason()};
    } else if (absl::IsNotFound(job.status())) {
      view = CopyView{v1::FAILED, std::string(job.status().message())};
    }
  }
  const Action action = NextAction(t, view);
  switch (action.kind) {
    case ActionKind::kNone:
    case ActionKind::kWait:
      if (view.has_value() && t.points(index).job_state() != view->state) {
        t.mutable_points(index)->set_job_state(view->state);
        (void)Commit(std::move(t));  // progress only: the caller need not advance again
      }
      return false;
    case ActionKind::kCreateCopy: {
      v1::ScalePoint* p = t.mutable_points(action.index);
      absl::StatusOr<v1::JobSpec> spec =
          SpecForSize(t.spec(), p->devices(), t.steps(), p->global_batch_tokens());
      absl::StatusOr<v1::Job> job = absl::InternalError("unreachable");
      if (spec.ok()) {
        v1::CreateJobRequest create;
        *create.mutable_spec() = *std::move(spec);
        // Idempotent per sweep and size.
        create.set_request_id(absl::StrCat(t.name(), "/", p->devices()));
        job = jobs_->CreateJob(create, t.tenant(), t.name());
      } else {
        job = spec.status();
      }
      if (!job.ok()) {
        End(std::move(t), v1::SCALE_TEST_FAILED,
            absl::StrCat("cannot create the copy at ", p->devices(),
                         " devices: ", job.status().message()));
        return true;
      }
      p->set_job(job->name());
      p->set_job_state(job->state());
      *p->mutable_layout() = job->layout();
      p->set_global_batch_tokens(job->spec().train().global_batch_tokens());
      t.set_state_reason(
          absl::StrCat("running the copy at ", p->devices(), " devices (", job->name(), ")"));
      {
        absl::MutexLock data(&data_mu_);
        Running& r = running_[name];
        r.window.Reset();
        r.generation = -1;
        copies_[job->name()] = name;
      }
      return Commit(std::move(t)).ok();
    }
    case ActionKind::kMeasure: {
      v1::ScalePoint* p = t.mutable_points(action.index);
      p->set_job_state(v1::SUCCEEDED);
      absl::Status measured;
      {
        absl::MutexLock data(&data_mu_);
        Running& r = running_[name];
        measured = MeasurePoint(r.window, WorldSize(p->layout()), t.warmup_steps(), p);
        copies_.erase(p->job());
        r.window.Reset();
      }
      if (!measured.ok()) {
        End(std::move(t), v1::SCALE_TEST_FAILED, std::string(measured.message()));
        return true;
      }
      return Commit(std::move(t)).ok();
    }
    case ActionKind::kFail:
      t.mutable_points(action.index)->set_job_state(view->state);
      End(std::move(t), v1::SCALE_TEST_FAILED, action.reason);
      return true;
    case ActionKind::kFinish: {
      Attribute(&t);
      for (v1::Finding& f : ScalingFindings(t, t.efficiency_threshold())) {
        *t.add_findings() = std::move(f);
      }
      const std::string reason = t.findings().empty()
                                     ? absl::StrCat("every size measured; efficiency at or above ",
                                                    t.efficiency_threshold(), " everywhere")
                                     : absl::StrCat("every size measured; SCALING raised at ",
                                                    t.findings_size(), " size(s)");
      End(t, v1::SCALE_TEST_SUCCEEDED, reason);
      PublishMetric(t);
      return true;
    }
  }
  return false;
}

absl::Status ScaleTestManager::Commit(v1::ScaleTest test) {
  *test.mutable_update_time() = ToProto(clock_->Now());
  if (absl::Status s = store_->Update(test); !s.ok()) {
    LOOM_LOG(WARNING) << "cannot store " << test.name() << ": " << s;
    return s;  // memory stays as it was; the next tick retries
  }
  absl::MutexLock data(&data_mu_);
  if (IsTerminal(test.state())) {
    running_.erase(test.name());
    for (auto it = copies_.begin(); it != copies_.end();) {
      it = it->second == test.name() ? copies_.erase(it) : std::next(it);
    }
  } else {
    running_[test.name()].test = std::move(test);
  }
  return absl::OkStatus();
}

void ScaleTestManager::End(v1::ScaleTest test, v1::ScaleTestState state,
                           const std::string& reason) {
  test.set_state(state);
  test.set_state_reason(reason);
  *test.mutable_end_time() = ToProto(clock_->Now());
  LOOM_LOG(INFO) << test.name() << ": " << v1::ScaleTestState_Name(state) << ": " << reason;
  (void)Commit(std::move(test));
}

void ScaleTestManager::PublishMetric(const v1::ScaleTest& test) {
  if (metrics_ == nullptr) return;
  std::map<int, double> efficiency;
  for (const v1::ScalePoint& p : test.points()) {
    if (p.measured() && p.efficiency() > 0) efficiency[p.devices()] = p.efficiency();
  }
  metrics_->SetScalingEfficiency(ScalingMetricJob(test), efficiency);
}

std::string ScalingMetricJob(const v1::ScaleTest& test) {
  const std::string name = test.spec().name().empty() ? "job" : test.spec().name();
  // Another tenant's sweep of a job with the same name must not replace this one's series.
  if (store::SameTenant(test.tenant(), auth::kDefaultTenant)) return name;
  return absl::StrCat(test.tenant(), "/", name);
}

void ScaleTestManager::StartTicker(absl::Duration interval) {
  ticker_ = std::thread([this, interval] {
    while (!stop_.WaitForNotificationWithTimeout(interval)) Tick();
  });
}

void ScaleTestManager::Shutdown() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (ticker_.joinable()) ticker_.join();
}

}  // namespace loom::scaling
