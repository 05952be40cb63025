#include "client/commands.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/doctor_format.h"
#include "client/exit_codes.h"
#include "client/job_format.h"
#include "client/job_name.h"
#include "client/plan_format.h"
#include "client/request_id.h"
#include "client/submit_many.h"
#include "common/spec_yaml.h"
#include "loom/v1/node.pb.h"
#include "server/planner/cluster_file.h"
#include "server/planner_service/plan_mapping.h"

namespace loom::client {
namespace {

using loom::v1::Job;

constexpr int kListPageSize = 500;

int Fail(CommandContext& ctx, const absl::Status& status) {
  *ctx.err << DescribeError(status, ctx.connection != nullptr ? ctx.connection->server() : "")
           << std::endl;
  return ExitCodeForStatus(status);
}

void PrintJob(CommandContext& ctx, const Job& job) {
  if (ctx.format == OutputFormat::kTable) {
    *ctx.out << FormatJobDetails(job, ctx.now());
  } else {
    *ctx.out << RenderMessage(job, ctx.format);
  }
  ctx.out->flush();
}

absl::StatusOr<Job> GetJob(CommandContext& ctx, const std::string& name) {
  loom::v1::GetJobRequest request;
  request.set_name(name);
  Job job;
  const absl::Status s = ctx.connection->Call(rpc::kGetJob, request, &job);
  if (!s.ok()) return s;
  return job;
}

// Follows `name` to its end with a live progress line. The line goes to stdout for tables and
// to stderr for json/yaml, so that stdout stays one parseable document. Prints the outcome
// (table) or the final job (json/yaml); returns the exit code.
int FollowWithProgress(CommandContext& ctx, const std::string& name) {
  const bool to_out = ctx.format == OutputFormat::kTable;
  ProgressDisplay display(to_out ? *ctx.out : *ctx.err, to_out ? ctx.out_is_tty : ctx.err_is_tty);
  absl::StatusOr<Job> final_job = FollowJob(
      *ctx.connection, name, [&](const Job& job) { display.Update(job); }, ctx.follow);
  display.Finish();
  if (!final_job.ok()) return Fail(ctx, final_job.status());
  if (to_out) {
    *ctx.out << FormatOutcomeLine(*final_job) << std::endl;
  } else {
    *ctx.err << FormatOutcomeLine(*final_job) << std::endl;
    *ctx.out << RenderMessage(*final_job, ctx.format) << std::flush;
  }
  return ExitCodeForJobState(final_job->state());
}

// One CreateJob call with the connection's deadline and credentials.
absl::Status CreateJobCall(CommandContext& ctx, const loom::v1::CreateJobRequest& request,
                           Job* job) {
  return ctx.connection->Call(rpc::kCreateJob, request, job);
}

}  // namespace

absl::StatusOr<loom::v1::JobState> ParseJobState(const std::string& text) {
  loom::v1::JobState state;
  if (loom::v1::JobState_Parse(absl::AsciiStrToUpper(text), &state) &&
      state != loom::v1::JOB_STATE_UNSPECIFIED) {
    return state;
  }
  std::vector<std::string> names;
  for (int s = loom::v1::JobState_MIN; s <= loom::v1::JobState_MAX; ++s) {
    if (s != loom::v1::JOB_STATE_UNSPECIFIED && loom::v1::JobState_IsValid(s)) {
      names.push_back(absl::AsciiStrToLower(loom::v1::JobState_Name(s)));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("--state: unknown job state '", text,
                                                 "'; use one of ", absl::StrJoin(names, ", ")));
}

int RunSubmit(CommandContext& ctx, const SubmitArgs& args) {
  if (args.files.empty()) {
    return Fail(ctx, absl::InvalidArgumentError("give the job spec with -f FILE ('-' for stdin)"));
  }
  if (args.files.size() > 1) return SubmitMany(ctx, args);
  // The file goes to loomd as text (CreateJobRequest.spec_yaml), which reads it with the same
  // reader (common/spec_yaml.h) and answers its errors with the file's name, line and key.
  // Parsing it here built the JobSpec descriptors and ran yaml-cpp in a fresh process: 2.3 M of
  // a submit's 5.5 M instructions; in a warm loomd yaml-cpp is about 0.1 ms of a submit's CPU
  // (docs/benchmarks.md, 2026-12-06 evening).
  absl::StatusOr<loom::v1::JobSpecYaml> yaml = ReadJobSpecFile(args.files[0]);
  if (!yaml.ok()) return Fail(ctx, yaml.status());
  loom::v1::CreateJobRequest request;
  *request.mutable_spec_yaml() = *std::move(yaml);
  request.set_request_id(args.request_id.empty() ? NewRequestId() : args.request_id);
  Job job;
  absl::Status s = CreateJobCall(ctx, request, &job);
  if (absl::IsInvalidArgument(s) && absl::StartsWith(s.message(), "spec is required")) {
    // A loomd older than spec_yaml ignores the field and finds no spec (the same request_id
    // created nothing): parse the file here, as loomctl did before, and send the spec.
    absl::StatusOr<loom::v1::JobSpec> spec = JobSpecFromYamlMessage(request.spec_yaml());
    if (!spec.ok()) return Fail(ctx, spec.status());
    request.clear_spec_yaml();
    *request.mutable_spec() = *std::move(spec);
    s = CreateJobCall(ctx, request, &job);
  }
  if (!s.ok()) return Fail(ctx, s);
  if (!args.wait) {
    if (ctx.format == OutputFormat::kTable) {
      *ctx.out << job.name() << std::endl;  // one line, so that scripts can capture it
    } else {
      *ctx.out << RenderMessage(job, ctx.format) << std::flush;
    }
    return kExitOk;
  }
  if (ctx.format == OutputFormat::kTable) *ctx.out << job.name() << std::endl;
  return FollowWithProgress(ctx, job.name());
}

int RunPlan(CommandContext& ctx, const PlanArgs& args) {
  absl::StatusOr<loom::v1::JobSpec> spec = LoadJobSpecFile(args.file);
  if (!spec.ok()) return Fail(ctx, spec.status());
  absl::StatusOr<loom::v1::PlanJobResponse> response;
  if (!args.cluster.empty()) {
    absl::StatusOr<planner::DeviceSpec> devices = planner::LoadClusterFile(args.cluster);
    if (!devices.ok()) return Fail(ctx, devices.status());
    response = planner_service::PlanJobOnDevices(*spec, *devices, args.top_k);
  } else {
    loom::v1::PlanJobRequest request;
    *request.mutable_spec() = *std::move(spec);
    request.set_top_k(args.top_k);
    loom::v1::PlanJobResponse answer;
    const absl::Status s = ctx.connection->Call(rpc::kPlanJob, request, &answer);
    if (s.ok()) {
      response = std::move(answer);
    } else {
      response = s;
    }
  }
  if (!response.ok()) return Fail(ctx, response.status());
  if (ctx.format == OutputFormat::kTable) {
    *ctx.out << FormatPlanTable(*response) << std::flush;
  } else {
    *ctx.out << RenderMessage(*response, ctx.format) << std::flush;
  }
  return kExitOk;
}

int RunGet(CommandContext& ctx, const std::string& job_arg, bool wait) {
  absl::StatusOr<std::string> name = NormalizeJobName(job_arg);
  if (!name.ok()) return Fail(ctx, name.status());
  absl::StatusOr<Job> job = wait ? FollowJob(
                                       *ctx.connection, *name, [](const Job&) {}, ctx.follow)
                                 : GetJob(ctx, *name);
  if (wait && job.ok()) job = GetJob(ctx, *name);  // GetJob carries the event log
  if (!job.ok()) return Fail(ctx, job.status());
  PrintJob(ctx, *job);
  return wait ? ExitCodeForJobState(job->state()) : kExitOk;
}

int RunDoctor(CommandContext& ctx, const std::string& job_arg) {
  absl::StatusOr<std::string> name = NormalizeJobName(job_arg);
  if (!name.ok()) return Fail(ctx, name.status());
  loom::v1::GetJobReportRequest request;
  request.set_name(*name);
  loom::v1::JobReport report;
  const absl::Status s = ctx.connection->Call(rpc::kGetJobReport, request, &report);
  if (!s.ok()) return Fail(ctx, s);
  *ctx.out << (ctx.format == OutputFormat::kTable ? FormatJobReport(report)
                                                  : RenderMessage(report, ctx.format));
  ctx.out->flush();
  return kExitOk;
}

int RunList(CommandContext& ctx, const std::string& state_arg) {
  loom::v1::ListJobsRequest request;
  request.set_page_size(kListPageSize);
  if (!state_arg.empty()) {
    absl::StatusOr<loom::v1::JobState> state = ParseJobState(state_arg);
    if (!state.ok()) return Fail(ctx, state.status());
    request.set_state(*state);
  }
  loom::v1::ListJobsResponse all;
  while (true) {
    loom::v1::ListJobsResponse page;
    const absl::Status s = ctx.connection->Call(rpc::kListJobs, request, &page);
    if (!s.ok()) return Fail(ctx, s);
    for (Job& job : *page.mutable_jobs()) *all.add_jobs() = std::move(job);
    if (page.next_page_token().empty()) break;
    request.set_page_token(page.next_page_token());
  }
  if (ctx.format == OutputFormat::kTable) {
    *ctx.out << FormatJobTable({all.jobs().begin(), all.jobs().end()}, ctx.now()) << std::flush;
  } else {
    *ctx.out << RenderMessage(all, ctx.format) << std::flush;
  }
  return kExitOk;
}

int RunWatch(CommandContext& ctx, const std::string& job_arg) {
  absl::StatusOr<std::string> name = NormalizeJobName(job_arg);
  if (!name.ok()) return Fail(ctx, name.status());
  return FollowWithProgress(ctx, *name);
}

int RunLogs(CommandContext& ctx, const LogsArgs& args) {
  absl::StatusOr<std::string> name = NormalizeJobName(args.job);
  if (!name.ok()) return Fail(ctx, name.status());
  if (args.rank.has_value() && *args.rank < 0) {
    return Fail(ctx, absl::InvalidArgumentError(absl::StrCat(
                         "--rank: ", *args.rank, " is not a rank; ranks are 0..world_size-1")));
  }
  loom::v1::StreamJobLogsRequest request;
  request.set_name(*name);
  request.set_follow(args.follow);
  if (args.rank.has_value()) request.set_rank(*args.rank);
  loom::v1::LogLine line;
  bool malformed = false;
  absl::Status s = ctx.connection->Stream(rpc::kStreamJobLogs, request, [&](std::string_view m) {
    if (!ParseStreamMessage(m, &line)) return !(malformed = true);
    switch (ctx.format) {
      case OutputFormat::kTable:
        *ctx.out << FormatLogLine(line) << '\n';
        break;
      case OutputFormat::kJson:  // JSON Lines: one object per line
        *ctx.out << RenderMessage(line, ctx.format, /*compact=*/true);
        break;
      case OutputFormat::kYaml:
        *ctx.out << "---\n" << RenderMessage(line, ctx.format);
        break;
    }
    if (args.follow) ctx.out->flush();
    return true;
  });
  ctx.out->flush();
  if (s.ok() && malformed) s = absl::InternalError("loomd sent a log line that does not parse");
  if (!s.ok()) return Fail(ctx, s);
  return kExitOk;
}

int RunCancel(CommandContext& ctx, const std::string& job_arg) {
  absl::StatusOr<std::string> name = NormalizeJobName(job_arg);
  if (!name.ok()) return Fail(ctx, name.status());
  loom::v1::CancelJobRequest request;
  request.set_name(*name);
  Job job;
  const absl::Status s = ctx.connection->Call(rpc::kCancelJob, request, &job);
  if (!s.ok()) return Fail(ctx, s);
  if (ctx.format == OutputFormat::kTable) {
    if (job.state() == loom::v1::CANCELLED) {
      *ctx.out << job.name() << " CANCELLED" << std::endl;
    } else {
      *ctx.out << job.name() << " cancelling (now " << JobStateName(job.state())
               << "; 'loomctl watch " << job.name() << "' follows it)" << std::endl;
    }
  } else {
    *ctx.out << RenderMessage(job, ctx.format) << std::flush;
  }
  return kExitOk;
}

int RunNodes(CommandContext& ctx) {
  loom::v1::ListNodesResponse response;
  const absl::Status s =
      ctx.connection->Call(rpc::kListNodes, loom::v1::ListNodesRequest(), &response);
  if (!s.ok()) return Fail(ctx, s);
  if (ctx.format == OutputFormat::kTable) {
    *ctx.out << FormatNodeTable({response.nodes().begin(), response.nodes().end()}, ctx.now())
             << std::flush;
  } else {
    *ctx.out << RenderMessage(response, ctx.format) << std::flush;
  }
  return kExitOk;
}

namespace {

// "gpu-1" and "nodes/gpu-1" name the same node; loomd checks the id.
std::string NodeName(const std::string& arg) {
  return arg.rfind("nodes/", 0) == 0 ? arg : absl::StrCat("nodes/", arg);
}

}  // namespace

int RunDrainNode(CommandContext& ctx, const DrainArgs& args) {
  loom::v1::DrainNodeRequest request;
  request.set_name(NodeName(args.node));
  request.set_move_jobs(args.move_jobs);
  request.set_stop_quarantined(args.stop_quarantined);
  request.set_drain(!args.undo);
  loom::v1::Node node;
  const absl::Status s = ctx.connection->Call(rpc::kDrainNode, request, &node);
  if (!s.ok()) return Fail(ctx, s);
  if (ctx.format == OutputFormat::kTable) {
    *ctx.out << FormatNodeTable({node}, ctx.now()) << std::flush;
  } else {
    *ctx.out << RenderMessage(node, ctx.format) << std::flush;
  }
  return kExitOk;
}

int RunDeleteNode(CommandContext& ctx, const std::string& node, bool force) {
  loom::v1::DeleteNodeRequest request;
  request.set_name(NodeName(node));
  request.set_force(force);
  loom::v1::DeleteNodeResponse response;
  const absl::Status s = ctx.connection->Call(rpc::kDeleteNode, request, &response);
  if (!s.ok()) return Fail(ctx, s);
  if (ctx.format == OutputFormat::kTable) *ctx.out << request.name() << " deleted" << std::endl;
  return kExitOk;
}

}  // namespace loom::client
