#include "server/rpc/job_service.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "server/jobs/job_state_machine.h"
#include "server/rpc/call_auth.h"

namespace loom::rpc {
namespace {

// The caller, if it may act on job `name`; the job as stored is returned through `job`.
absl::StatusOr<auth::Principal> AuthorizeJob(const grpc::ServerContext* context,
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

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context,
                                      const v1::WatchJobRequest* request,
                                      grpc::ServerWriter<v1::JobUpdate>* writer) {
  absl::StatusOr<auth::Principal> who =
      AuthorizeJob(context, authenticator_, manager_, request->name(), nullptr);
  if (!who.ok()) return ToGrpcStatus(who.status());
  absl::StatusOr<std::shared_ptr<jobs::JobSubscription>> subscription =
      manager_->WatchJob(request->name());
  if (!subscription.ok()) return ToGrpcStatus(subscription.status());
  while (!context->IsCancelled()) {
    std::optional<v1::Job> job = (*subscription)->Next(kStreamPoll);
    if (!job.has_value()) {
      if ((*subscription)->closed()) break;
      continue;
    }
    const bool terminal = jobs::IsTerminal(job->state());
    v1::JobUpdate update;
    *update.mutable_job() = std::move(*job);
    RedactForeign(*who, update.mutable_job());
    if (!writer->Write(update) || terminal) break;
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::StreamJobLogs(grpc::ServerContext* context,
                                           const v1::StreamJobLogsRequest* request,
                                           grpc::ServerWriter<v1::LogLine>* writer) {
  absl::StatusOr<std::string> id = jobs::ParseJobName(request->name());
  if (!id.ok()) return ToGrpcStatus(id.status());
  if (absl::StatusOr<auth::Principal> who =
          AuthorizeJob(context, authenticator_, manager_, request->name(), nullptr);
      !who.ok()) {
    return ToGrpcStatus(who.status());
  }
  std::optional<int> rank;
  if (request->has_rank() && request->rank() != -1) {
    if (request->rank() < 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("rank must be >= 0 (got ", request->rank(),
                                       "); omit it (or give -1) for every rank"));
    }
    rank = request->rank();
  }
  absl::StatusOr<bool> finished = manager_->IsJobFinished(request->name());
  if (!finished.ok()) return ToGrpcStatus(finished.status());

  int64_t offset = 0;
  bool final_pass = !request->follow() || *finished;
  while (!context->IsCancelled()) {
    absl::StatusOr<jobs::LogBatch> batch = logs_->Read(*id, offset, rank);
    if (!batch.ok()) return ToGrpcStatus(batch.status());
    for (const v1::LogLine& line : batch->lines) {
      if (!writer->Write(line)) return grpc::Status::OK;  // the client went away
    }
    const bool advanced = batch->next_offset > offset;
    offset = batch->next_offset;
    if (advanced) continue;  // read until caught up
    if (final_pass) break;
    // Caught up: wait for more, and decide on the job's end only after reading to the end
    // once more (lines written just before the terminal state are still sent).
    logs_->WaitForMore(*id, offset, kStreamPoll);
    absl::StatusOr<bool> done = manager_->IsJobFinished(request->name());
    if (!done.ok()) return ToGrpcStatus(done.status());
    final_pass = *done;
  }
  return grpc::Status::OK;
}

}  // namespace loom::rpc
