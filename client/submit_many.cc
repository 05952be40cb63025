#include "client/submit_many.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/exit_codes.h"
#include "client/output_format.h"
#include "client/request_id.h"
#include "common/spec_yaml.h"
#include "loom/v1/job.pb.h"

namespace loom::client {
namespace {

// Runs `work(i)` for every i in [0, n) on up to kSubmitConcurrency threads, this one included.
template <typename Work>
void ForEachIndex(size_t n, const Work& work) {
  std::atomic<size_t> next{0};
  auto loop = [&] {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) work(i);
  };
  std::vector<std::thread> helpers;
  const size_t threads = std::min<size_t>(kSubmitConcurrency, n);
  for (size_t t = 1; t < threads; ++t) helpers.emplace_back(loop);
  loop();
  for (std::thread& t : helpers) t.join();
}

}  // namespace

int SubmitMany(CommandContext& ctx, const SubmitArgs& args) {
  const std::vector<std::string>& files = args.files;
  const std::string server = ctx.connection != nullptr ? ctx.connection->server() : "";
  if (args.wait) {
    *ctx.err << "loomctl: --wait follows one job; submit the files without it, then follow each "
                "job with `loomctl get --wait JOB` or `loomctl watch JOB`"
             << std::endl;
    return kExitInvalidInput;
  }
  if (std::find(files.begin(), files.end(), "-") != files.end()) {
    *ctx.err << "loomctl: -f - (standard input) can only be the one spec of a submit; give "
                "the sweep's specs as files"
             << std::endl;
    return kExitInvalidInput;
  }

  // Every spec first: nothing is sent unless all of them are good.
  std::vector<std::optional<absl::StatusOr<loom::v1::JobSpec>>> specs(files.size());
  ForEachIndex(files.size(), [&](size_t i) { specs[i] = LoadJobSpecFile(files[i]); });
  int first_bad = -1;
  for (size_t i = 0; i < files.size(); ++i) {
    if (specs[i]->ok()) continue;
    *ctx.err << DescribeError(specs[i]->status(), server) << std::endl;
    if (first_bad < 0) first_bad = static_cast<int>(i);
  }
  if (first_bad >= 0) {
    *ctx.err << "loomctl: nothing was submitted; fix the spec(s) above and run the command again"
             << std::endl;
    return ExitCodeForStatus(specs[first_bad]->status());
  }

  std::vector<absl::StatusOr<loom::v1::Job>> jobs(files.size(),
                                                  absl::InternalError("not submitted"));
  ForEachIndex(files.size(), [&](size_t i) {
    loom::v1::CreateJobRequest request;
    *request.mutable_spec() = *std::move(*specs[i]);
    request.set_request_id(args.request_id.empty() ? NewRequestId()
                                                   : absl::StrCat(args.request_id, "-", i + 1));
    loom::v1::Job job;
    const absl::Status s = ctx.connection->Call(rpc::kCreateJob, request, &job);
    if (s.ok()) {
      jobs[i] = std::move(job);
    } else {
      jobs[i] = s;
    }
  });

  int exit_code = kExitOk;
  loom::v1::ListJobsResponse created;  // the json/yaml document
  for (size_t i = 0; i < files.size(); ++i) {
    if (!jobs[i].ok()) {
      *ctx.err << DescribeError(jobs[i].status(), server) << " (" << files[i] << ")" << std::endl;
      if (exit_code == kExitOk) exit_code = ExitCodeForStatus(jobs[i].status());
      continue;
    }
    if (ctx.format == OutputFormat::kTable) {
      *ctx.out << jobs[i]->name() << "\n";
    } else {
      *created.add_jobs() = *std::move(jobs[i]);
    }
  }
  if (ctx.format != OutputFormat::kTable) *ctx.out << RenderMessage(created, ctx.format);
  ctx.out->flush();
  return exit_code;
}

}  // namespace loom::client
