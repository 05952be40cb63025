#include "client/trace_command.h"

#include <algorithm>
#include <fstream>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/exit_codes.h"
#include "client/job_name.h"
#include "client/trace_json.h"
#include "common/status_macros.h"
#include "loom/v1/job.pb.h"

namespace loom::client {
namespace {

absl::Status BadSteps(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--steps \"", text, "\": ", why,
                                                 "; give A:B with 1 <= A <= B and at most ",
                                                 kMaxTraceSteps, " steps, e.g. --steps 10:13"));
}

int Fail(CommandContext& ctx, const absl::Status& status) {
  *ctx.err << DescribeError(status, ctx.connection != nullptr ? ctx.connection->server() : "")
           << std::endl;
  return ExitCodeForStatus(status);
}

// Waits until the job is RUNNING and rank 0 has reported `last_step` (or later), the job ends,
// or `wait` passes, polling GetJob: a script that submits a job and then traces its first steps
// gets them instead of an error. Returns the job's last state seen; a failed GetJob's status.
absl::StatusOr<loom::v1::JobState> WaitForSteps(CommandContext& ctx, const std::string& name,
                                                int64_t last_step, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  for (;;) {
    loom::v1::GetJobRequest request;
    request.set_name(name);
    loom::v1::Job job;
    RETURN_IF_ERROR(ctx.connection->Call(rpc::kGetJob, request, &job));
    const bool ended = job.state() == loom::v1::SUCCEEDED || job.state() == loom::v1::FAILED ||
                       job.state() == loom::v1::CANCELLED;
    // The step the job reports is the last one done; the ring holds it once it was reported.
    if (ended || (job.state() == loom::v1::RUNNING && job.progress().step() > last_step) ||
        absl::Now() >= deadline) {
      return job.state();
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

}  // namespace

absl::StatusOr<StepRange> ParseStepRange(absl::string_view text) {
  if (text.empty()) return StepRange{};
  const size_t colon = text.find(':');
  const absl::string_view a = text.substr(0, colon);
  const absl::string_view b = colon == absl::string_view::npos ? a : text.substr(colon + 1);
  StepRange r;
  if (!absl::SimpleAtoi(a, &r.first) || !absl::SimpleAtoi(b, &r.last)) {
    return BadSteps(text, "not two whole numbers");
  }
  if (r.first < 1) return BadSteps(text, "steps count from 1");
  if (r.last < r.first) return BadSteps(text, "the range ends before it starts");
  if (r.last - r.first + 1 > kMaxTraceSteps) {
    return BadSteps(text, absl::StrCat("the range spans ", r.last - r.first + 1, " steps"));
  }
  return r;
}

int RunTrace(CommandContext& ctx, const TraceArgs& args) {
  absl::StatusOr<std::string> name = NormalizeJobName(args.job);
  if (!name.ok()) return Fail(ctx, name.status());
  absl::StatusOr<StepRange> steps = ParseStepRange(args.steps);
  if (!steps.ok()) return Fail(ctx, steps.status());
  if (args.wait_seconds > 0) {
    // The default range (steps.last == 0) is the latest steps: a RUNNING job with one is enough.
    absl::StatusOr<loom::v1::JobState> state =
        WaitForSteps(ctx, *name, std::max<int64_t>(steps->last, 1),
                     absl::Seconds(std::min(args.wait_seconds, 86400.0)));
    if (!state.ok()) return Fail(ctx, state.status());
  }
  loom::v1::GetJobTraceRequest request;
  request.set_name(*name);
  request.set_first_step(steps->first);
  request.set_last_step(steps->last);
  loom::v1::JobTrace trace;
  const absl::Status s = ctx.connection->Call(rpc::kGetJobTrace, request, &trace);
  if (!s.ok()) return Fail(ctx, s);

  const bool to_stdout = args.file == "-";
  if (to_stdout) {
    WriteTraceEventJson(trace, *ctx.out);
    ctx.out->flush();
  } else {
    std::ofstream file(args.file, std::ios::binary | std::ios::trunc);
    if (file) WriteTraceEventJson(trace, file);
    file.close();
    if (!file) {
      *ctx.err << "loomctl: cannot write " << args.file << " (-o): check the directory exists "
               << "and is writable" << std::endl;
      return kExitJobFailed;
    }
  }
  int64_t events = 0;
  for (const loom::v1::RankTrace& r : trace.ranks()) events += r.events_size();
  std::ostream& summary = to_stdout ? *ctx.err : *ctx.out;
  summary << "trace of " << trace.name() << " (generation " << trace.generation() << "), steps "
          << trace.first_step() << ".." << trace.last_step() << ": " << trace.ranks_size()
          << " rank(s), " << events << " events"
          << (to_stdout ? ""
                        : absl::StrCat(" -> ", args.file,
                                       " (open it in ui.perfetto.dev or chrome://tracing)"))
          << std::endl;
  for (const std::string& node : trace.missing_nodes()) {
    *ctx.err << "loomctl: warning: " << node
             << " did not answer in time; its ranks are missing from the trace" << std::endl;
  }
  for (const std::string& note : trace.notes()) *ctx.err << "loomctl: note: " << note << "\n";
  ctx.err->flush();
  return kExitOk;
}

}  // namespace loom::client
