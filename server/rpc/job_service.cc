#include "server/rpc/job_service.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "server/jobs/job_state_machine.h"
#include "server/rpc/call_auth.h"
#include "server/rpc/stream_logs_reactor.h"
#include "server/rpc/watch_job_reactor.h"

namespace loom::rpc {
namespace {

// The caller, if it may act on job `name`; the job as stored is returned through `job`.
absl::StatusOr<auth::Principal> AuthorizeJob(const grpc::ServerContextBase* context,
                                             auth::Authenticator* authenticator,
                                             jobs::JobManager* manager, const std::string& name,
                                             v1::Job* job) {
  absl::StatusOr<auth::Principal> who = AuthenticatePerson(context, authenticator);
  if (!who.ok()) return who.status();
  absl::StatusOr<v1::Job> found = manager->GetJob(name);
  if (!found.ok()) return found.status();
  if (absl::Status s = CheckJobAccess(*who, *found); !s.ok()) return s;
  if (job != nullptr) *job = std::move(*found);
  return who;
}

}  // namespace

grpc::Status JobServiceImpl::CreateJob(grpc::ServerContext* context,
                                       const v1::CreateJobRequest* request, v1::Job* response) {
  absl::StatusOr<auth::Principal> who = AuthenticatePerson(context, authenticator_);
  if (!who.ok()) return ToGrpcStatus(who.status());
  absl::StatusOr<v1::Job> job = manager_->CreateJob(*request, who->subject);
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = std::move(*job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                    v1::Job* response) {
  absl::StatusOr<auth::Principal> who =
      AuthorizeJob(context, authenticator_, manager_, request->name(), response);
  if (!who.ok()) return ToGrpcStatus(who.status());
  RedactForeign(*who, response);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context,
                                      const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  absl::StatusOr<auth::Principal> who = AuthenticatePerson(context, authenticator_);
  if (!who.ok()) return ToGrpcStatus(who.status());
  std::optional<std::string> tenant;
  if (!who->is_admin()) tenant = who->subject;
  absl::StatusOr<v1::ListJobsResponse> page = manager_->ListJobs(*request, tenant);
  if (!page.ok()) return ToGrpcStatus(page.status());
  *response = std::move(*page);
  for (v1::Job& job : *response->mutable_jobs()) RedactForeign(*who, &job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context,
                                       const v1::CancelJobRequest* request, v1::Job* response) {
  absl::StatusOr<auth::Principal> who =
      AuthorizeJob(context, authenticator_, manager_, request->name(), nullptr);
  if (!who.ok()) return ToGrpcStatus(who.status());
  absl::StatusOr<v1::Job> job = manager_->CancelJob(request->name());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = std::move(*job);
  RedactForeign(*who, response);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJobReport(grpc::ServerContext* context,
                                          const v1::GetJobReportRequest* request,
                                          v1::JobReport* response) {
  absl::StatusOr<auth::Principal> who =
      AuthorizeJob(context, authenticator_, manager_, request->name(), nullptr);
  if (!who.ok()) return ToGrpcStatus(who.status());
  absl::StatusOr<v1::JobReport> report = manager_->GetJobReport(request->name());
  if (!report.ok()) return ToGrpcStatus(report.status());
  *response = std::move(*report);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJobTrace(grpc::ServerContext* context,
                                         const v1::GetJobTraceRequest* request,
                                         v1::JobTrace* response) {
  absl::StatusOr<auth::Principal> who =
      AuthorizeJob(context, authenticator_, manager_, request->name(), nullptr);
  if (!who.ok()) return ToGrpcStatus(who.status());
  absl::StatusOr<std::unique_ptr<StreamSlot>> slot = traces_.Acquire(who->subject);
  if (!slot.ok()) return ToGrpcStatus(slot.status());
  absl::StatusOr<v1::JobTrace> trace = manager_->GetJobTrace(*request);
  if (!trace.ok()) return ToGrpcStatus(trace.status());
  *response = std::move(*trace);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::PlanJob(grpc::ServerContext* context,
                                     const v1::PlanJobRequest* request,
                                     v1::PlanJobResponse* response) {
  absl::StatusOr<auth::Principal> who = AuthenticatePerson(context, authenticator_);
  if (!who.ok()) return ToGrpcStatus(who.status());
  absl::StatusOr<v1::PlanJobResponse> plan = manager_->PlanJob(*request);
  if (!plan.ok()) return ToGrpcStatus(plan.status());
  *response = std::move(*plan);
  return grpc::Status::OK;
}

namespace {

// A stream that ends at once with `status` (a refused WatchJob or StreamJobLogs).
template <typename Response>
class RefusedWrite final : public grpc::ServerWriteReactor<Response> {
 public:
  explicit RefusedWrite(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<v1::JobUpdate>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  absl::StatusOr<auth::Principal> who =
      AuthorizeJob(context, authenticator_, manager_, request->name(), nullptr);
  if (!who.ok()) return new RefusedWrite<v1::JobUpdate>(ToGrpcStatus(who.status()));
  absl::StatusOr<std::unique_ptr<StreamSlot>> slot = streams_.Acquire(who->subject);
  if (!slot.ok()) return new RefusedWrite<v1::JobUpdate>(ToGrpcStatus(slot.status()));
  absl::StatusOr<std::shared_ptr<jobs::JobSubscription>> subscription =
      manager_->WatchJob(request->name());
  if (!subscription.ok())
    return new RefusedWrite<v1::JobUpdate>(ToGrpcStatus(subscription.status()));
  return WatchJobReactor::Start(*std::move(who), *std::move(subscription), *std::move(slot));
}

grpc::ServerWriteReactor<v1::LogLine>* JobServiceImpl::StreamJobLogs(
    grpc::CallbackServerContext* context, const v1::StreamJobLogsRequest* request) {
  absl::StatusOr<std::string> id = jobs::ParseJobName(request->name());
  if (!id.ok()) return new RefusedWrite<v1::LogLine>(ToGrpcStatus(id.status()));
  absl::StatusOr<auth::Principal> who =
      AuthorizeJob(context, authenticator_, manager_, request->name(), nullptr);
  if (!who.ok()) return new RefusedWrite<v1::LogLine>(ToGrpcStatus(who.status()));
  std::optional<int> rank;
  if (request->has_rank() && request->rank() != -1) {
    if (request->rank() < 0) {
      return new RefusedWrite<v1::LogLine>(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       absl::StrCat("rank must be >= 0 (got ", request->rank(),
                                    "); omit it (or give -1) for every rank")));
    }
    rank = request->rank();
  }
  absl::StatusOr<std::unique_ptr<StreamSlot>> slot = streams_.Acquire(who->subject);
  if (!slot.ok()) return new RefusedWrite<v1::LogLine>(ToGrpcStatus(slot.status()));
  absl::StatusOr<bool> finished = manager_->IsJobFinished(request->name());
  if (!finished.ok()) return new RefusedWrite<v1::LogLine>(ToGrpcStatus(finished.status()));
  StreamLogsReactor::Params params;
  params.manager = manager_;
  params.logs = logs_;
  params.name = request->name();
  params.id = *std::move(id);
  params.rank = rank;
  params.follow = request->follow();
  params.finished = *finished;
  params.slot = *std::move(slot);
  return StreamLogsReactor::Start(std::move(params));
}

}  // namespace loom::rpc
