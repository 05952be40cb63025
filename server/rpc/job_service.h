// JobService over gRPC: a thin adapter from the wire to JobManager. It converts statuses and
// runs the two server streams (WatchJob, StreamJobLogs); every decision is the manager's.
//
// Every call is authenticated and authorized first (call_auth.h): a tenant sees and acts on its
// own jobs only.
//
// Threading: the unary methods use the sync gRPC API (each call runs on a gRPC handler thread).
// WatchJob and StreamJobLogs use the callback API (watch_job_reactor.h,
// stream_logs_reactor.h): an open stream holds no thread while it waits. Every stream counts
// against its caller's bound on open streams (stream_limiter.h).
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"
#include "loom/v1/job.grpc.pb.h"
#include "server/auth/authenticator.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/log_store.h"
#include "server/rpc/stream_limiter.h"

namespace loom::rpc {

inline constexpr absl::Duration kStreamPoll = absl::Milliseconds(200);

// The two streams on the callback API: the per-method wrappers leave every other method as the
// sync API's override.
class JobServiceImpl final
    : public v1::JobService::WithCallbackMethod_WatchJob<
          v1::JobService::WithCallbackMethod_StreamJobLogs<v1::JobService::Service>> {
 public:
  // Every pointer must outlive the service. `max_streams_per_client` >= 1.
  JobServiceImpl(jobs::JobManager* manager, jobs::LogStore* logs,
                 auth::Authenticator* authenticator,
                 int max_streams_per_client = kDefaultMaxStreamsPerClient)
      : manager_(manager),
        logs_(logs),
        authenticator_(authenticator),
        streams_(max_streams_per_client) {}

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
  // Every rank's timeline over a step range (JobManager::GetJobTrace); tenant-checked like
  // GetJob. Holds its handler thread up to loomd's trace wait; RESOURCE_EXHAUSTED when the caller
  // already has kMaxTracesPerClient calls in flight (loomd has few trace slots for everyone).
  grpc::Status GetJobTrace(grpc::ServerContext* context, const v1::GetJobTraceRequest* request,
                           v1::JobTrace* response) override;
  // The current job first, then every update; ends after a terminal state, when the client
  // goes away, or when loomd shuts down.
  // RESOURCE_EXHAUSTED when the caller already holds its limit of open streams.
  grpc::ServerWriteReactor<v1::JobUpdate>* WatchJob(grpc::CallbackServerContext* context,
                                                    const v1::WatchJobRequest* request) override;
  // Every stored line (optionally of one rank); with follow, new lines until the job is
  // terminal and every line has been sent.
  grpc::ServerWriteReactor<v1::LogLine>* StreamJobLogs(
      grpc::CallbackServerContext* context, const v1::StreamJobLogsRequest* request) override;

 private:
  jobs::JobManager* const manager_;
  jobs::LogStore* const logs_;
  auth::Authenticator* const authenticator_;
  StreamLimiter streams_;
  StreamLimiter traces_{kMaxTracesPerClient, "GetJobTrace calls in flight",
                        "wait for them to answer (each waits a few seconds at most)"};
};

}  // namespace loom::rpc
