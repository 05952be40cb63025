// JobService over gRPC: a thin adapter from the wire to JobManager. It converts statuses and
// runs the two server streams (WatchJob, StreamJobLogs); every decision is the manager's.
//
// Every call is authenticated and authorized first (call_auth.h): a tenant sees and acts on its
// own jobs only.
//
// Threading: the sync gRPC API; each call runs on a gRPC handler thread. A stream holds its
// thread while it waits, polling for client cancellation every kStreamPoll so that a client
// that goes away frees its thread promptly.
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"
#include "loom/v1/job.grpc.pb.h"
#include "server/auth/authenticator.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/log_store.h"

namespace loom::rpc {

inline constexpr absl::Duration kStreamPoll = absl::Milliseconds(200);

class JobServiceImpl final : public v1::JobService::Service {
 public:
  // Every pointer must outlive the service.
  JobServiceImpl(jobs::JobManager* manager, jobs::LogStore* logs,
                 auth::Authenticator* authenticator)
      : manager_(manager), logs_(logs), authenticator_(authenticator) {}

  grpc::Status CreateJob(grpc::ServerContext* context, const v1::CreateJobRequest* request,
                         v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  grpc::Status PlanJob(grpc::ServerContext* context, const v1::PlanJobRequest* request,
                       v1::PlanJobResponse* response) override;
  // The doctor's report; tenant-checked exactly like GetJob (another tenant's job is NOT_FOUND).
  grpc::Status GetJobReport(grpc::ServerContext* context, const v1::GetJobReportRequest* request,
                            v1::JobReport* response) override;
  // The current job first, then every update; ends after a terminal state, when the client
  // goes away, or when loomd shuts down.
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobUpdate>* writer) override;
  // Every stored line (optionally of one rank); with follow, new lines until the job is
  // terminal and every line has been sent.
  grpc::Status StreamJobLogs(grpc::ServerContext* context, const v1::StreamJobLogsRequest* request,
                             grpc::ServerWriter<v1::LogLine>* writer) override;

 private:
  jobs::JobManager* const manager_;
  jobs::LogStore* const logs_;
  auth::Authenticator* const authenticator_;
};

}  // namespace loom::rpc
