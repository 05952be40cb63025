#include "client/plan_format.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/job_format.h"

namespace loom::client {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::vector<std::string> Row(const std::string& rank, const loom::v1::Plan& plan) {
  const loom::v1::Layout& l = plan.layout();
  return {rank,
          absl::StrCat(l.tensor()),
          absl::StrCat(l.pipeline()),
          absl::StrCat(l.data()),
          absl::StrCat(l.micro_batch(), " x ", l.num_micro_batches()),
          l.recompute().empty() ? "none" : l.recompute(),
          l.zero1() ? "on" : "off",
          FormatStepSeconds(plan.step_seconds()),
          FormatRate(plan.tokens_per_second()),
          absl::StrFormat("%.1f%%", plan.mfu() * 100),
          absl::StrFormat("%.1f / %.0f GiB", plan.memory().total() / kGiB,
                          plan.memory().device() / kGiB)};
}

}  // namespace

std::string FormatStepSeconds(double seconds) {
  if (seconds >= 1) return absl::StrFormat("%.2f s", seconds);
  if (seconds >= 1e-3) return absl::StrFormat("%.0f ms", seconds * 1e3);
  return absl::StrFormat("%.0f µs", seconds * 1e6);
}

std::string FormatRate(double per_second) {
  if (per_second >= 1e6) return absl::StrFormat("%.2fM", per_second / 1e6);
  if (per_second >= 1e3) return absl::StrFormat("%.1fk", per_second / 1e3);
  return absl::StrFormat("%.0f", per_second);
}

std::string FormatPlanTable(const loom::v1::PlanJobResponse& response) {
  std::string out = absl::StrCat("Devices: ", response.devices(), "; global batch ",
                                 response.global_batch_sequences(), " sequences; ",
                                 response.layouts_evaluated(), " layouts evaluated\n");
  std::vector<std::vector<std::string>> rows = {{"RANK", "TP", "PP", "DP", "MICRO-BATCH",
                                                 "RECOMPUTE", "ZERO1", "STEP", "TOKENS/S", "MFU",
                                                 "PEAK MEMORY"}};
  for (int i = 0; i < response.plans_size(); ++i) {
    rows.push_back(Row(absl::StrCat(i + 1), response.plans(i)));
  }
  if (response.has_constrained()) rows.push_back(Row("spec", response.constrained()));
  absl::StrAppend(&out, FormatColumns(rows));
  if (response.has_constrained()) {
    absl::StrAppend(&out, "(spec: the best layout that honours the spec's parallelism)\n");
  }
  if (response.plans_size() > 0) {
    absl::StrAppend(&out, "Why plan 1:\n");
    for (const std::string& reason : response.plans(0).reasons()) {
      absl::StrAppend(&out, "  ", reason, "\n");
    }
  }
  if (!response.rejected().empty()) {
    absl::StrAppend(&out, "Rejected:\n");
    for (const std::string& line : response.rejected()) absl::StrAppend(&out, "  ", line, "\n");
  }
  return out;
}

}  // namespace loom::client
