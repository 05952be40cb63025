#include "client/scale_test_command.h"

#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/exit_codes.h"
#include "client/output_format.h"
#include "client/request_id.h"
#include "client/scale_plot.h"
#include "common/spec_yaml.h"

namespace loom::client {
namespace {

using loom::v1::ScaleTest;

constexpr int kMaxSizes = 8;

int Fail(CommandContext& ctx, const absl::Status& status) {
  *ctx.err << DescribeError(status, ctx.connection != nullptr ? ctx.connection->server() : "")
           << std::endl;
  return ExitCodeForStatus(status);
}

std::string LayoutText(const loom::v1::Layout& l) {
  return absl::StrCat("dp", std::max(1, l.data()), " tp", std::max(1, l.tensor()), " pp",
                      std::max(1, l.pipeline()));
}

std::string Share(double seconds, double step) {
  return step > 0 ? absl::StrFormat("%.1f%%", 100 * seconds / step) : "-";
}

bool Terminal(loom::v1::ScaleTestState s) {
  return s == loom::v1::SCALE_TEST_SUCCEEDED || s == loom::v1::SCALE_TEST_FAILED ||
         s == loom::v1::SCALE_TEST_CANCELLED;
}

}  // namespace

absl::StatusOr<std::vector<int>> ParseDevicesFlag(const std::string& text) {
  std::vector<int> out;
  if (text.empty()) {
    return absl::InvalidArgumentError("--devices is required: the sizes to run, e.g. 1,2,4");
  }
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int value = 0;
    if (!absl::SimpleAtoi(part, &value) || value <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--devices: \"", part, "\" is not a positive device count; give sizes like 1,2,4,8"));
    }
    if (!out.empty() && value <= out.back()) {
      return absl::InvalidArgumentError(absl::StrCat("--devices: ", value, " after ", out.back(),
                                                     "; list the sizes strictly increasing"));
    }
    out.push_back(value);
  }
  if (out.size() > static_cast<size_t>(kMaxSizes)) {
    return absl::InvalidArgumentError(absl::StrCat("--devices: ", out.size(),
                                                   " sizes; give at most ", kMaxSizes,
                                                   " (each size is a job run in turn)"));
  }
  return out;
}

std::string FormatScaleTest(const ScaleTest& t) {
  std::string out = absl::StrCat(
      t.name(), "  ", loom::v1::ScaleTestState_Name(t.state()), "  ", t.weak() ? "weak" : "strong",
      " scaling of ", t.spec().name().empty() ? "job" : t.spec().name(), ", ", t.steps(),
      " steps per size (", t.warmup_steps(), " warm-up)\n  ", t.state_reason(), "\n\n");
  absl::StrAppendFormat(&out, "%-8s %-12s %9s %11s %10s %7s %7s %7s %7s %7s %7s  %s\n", "DEVICES",
                        "LAYOUT", "STEP_S", "TOKENS/S", "EFFICIENCY", "LOST", "COMM", "BUBBLE",
                        "IMBAL", "REST", "UNEXPL", "JOB");
  for (const loom::v1::ScalePoint& p : t.points()) {
    if (!p.measured()) {
      absl::StrAppendFormat(
          &out, "%-8d %-12s %9s %11s %10s %7s %7s %7s %7s %7s %7s  %s%s\n", p.devices(),
          p.job().empty() ? "-" : LayoutText(p.layout()), "-", "-", "-", "-", "-", "-", "-", "-",
          "-", p.job().empty() ? "-" : p.job(),
          p.job().empty() ? "" : absl::StrCat(" (", loom::v1::JobState_Name(p.job_state()), ")"));
      continue;
    }
    const loom::v1::ScalingLoss& l = p.loss();
    const double s = p.step_seconds();
    absl::StrAppendFormat(&out, "%-8d %-12s %9.4f %11.0f %10.3f %7s %7s %7s %7s %7s %7s  %s\n",
                          p.devices(), LayoutText(p.layout()), s, p.tokens_per_second(),
                          p.efficiency(), Share(l.lost_seconds(), s), Share(l.comm_exposed(), s),
                          Share(l.bubble(), s), Share(l.imbalance(), s), Share(l.rest(), s),
                          Share(l.unexplained(), s), p.job());
  }
  out +=
      "\nLOST = step - ideal (the first size's step scaled by the work per device), as a share of "
      "the step.\nMeasured: COMM and BUBBLE of the critical (busiest) rank, IMBAL its busy time - "
      "the mean,\nREST compute inflation (mean busy - ideal busy); UNEXPL is what they leave.\n";
  if (!t.findings().empty()) {
    out += "\nFINDINGS\n";
    for (const loom::v1::Finding& f : t.findings()) {
      absl::StrAppend(&out, "  ", loom::v1::FindingSeverity_Name(f.severity()), " ",
                      loom::v1::FindingKind_Name(f.kind()), " (", f.subject(), "): ", f.summary(),
                      "\n    fix: ", f.fix(), "\n");
    }
  }
  return out;
}

int RunScaleTest(CommandContext& ctx, const ScaleTestArgs& args) {
  absl::StatusOr<std::vector<int>> devices = ParseDevicesFlag(args.devices);
  if (!devices.ok()) return Fail(ctx, devices.status());
  absl::StatusOr<loom::v1::JobSpec> spec = LoadJobSpecFile(args.file);
  if (!spec.ok()) return Fail(ctx, spec.status());
  loom::v1::CreateScaleTestRequest request;
  *request.mutable_spec() = *std::move(spec);
  for (int d : *devices) request.add_devices(d);
  request.set_weak(args.weak);
  request.set_steps(args.steps);
  request.set_request_id(args.request_id.empty() ? NewRequestId() : args.request_id);
  ScaleTest test;
  {
    const absl::Status s = ctx.connection->Call(rpc::kCreateScaleTest, request, &test);
    if (!s.ok()) return Fail(ctx, s);
  }
  *ctx.err << "scale-test " << test.name() << ": " << devices->size() << " sizes, one at a time"
           << std::endl;
  std::string last;
  while (!Terminal(test.state())) {
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(args.poll));
    loom::v1::GetScaleTestRequest get;
    get.set_name(test.name());
    ScaleTest next;
    const absl::Status s = ctx.connection->Call(rpc::kGetScaleTest, get, &next);
    if (!s.ok()) return Fail(ctx, s);
    test = std::move(next);
    if (test.state_reason() != last) {
      last = test.state_reason();
      *ctx.err << "scale-test: " << last << std::endl;
    }
  }
  if (ctx.format == OutputFormat::kTable) {
    *ctx.out << FormatScaleTest(test);
  } else {
    *ctx.out << RenderMessage(test, ctx.format);
  }
  ctx.out->flush();
  if (!args.plot.empty()) {
    std::ofstream file(args.plot, std::ios::trunc);
    file << ScalingSvg(test);
    file.close();
    if (!file) {
      return Fail(ctx, absl::FailedPreconditionError(
                           absl::StrCat("--plot: cannot write ", args.plot,
                                        "; give a path in a directory you can write")));
    }
    *ctx.err << "plot written to " << args.plot << std::endl;
  }
  return test.state() == loom::v1::SCALE_TEST_SUCCEEDED ? kExitOk : kExitJobFailed;
}

}  // namespace loom::client
