#include "client/doctor_format.h"

#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/job_format.h"

namespace loom::client {
namespace {

using loom::v1::Finding;

std::string KindOf(const Finding& f) { return loom::v1::FindingKind_Name(f.kind()); }

std::string SeverityOf(const Finding& f) {
  std::string_view name = loom::v1::FindingSeverity_Name(f.severity());
  constexpr std::string_view kPrefix = "FINDING_SEVERITY_";
  if (name.substr(0, kPrefix.size()) == kPrefix) name.remove_prefix(kPrefix.size());
  return std::string(name);
}

void AppendFinding(std::string* out, const Finding& f, bool details) {
  absl::StrAppendFormat(out, "%-22s %-9s %-24s", KindOf(f), SeverityOf(f), f.subject());
  if (f.predicted_gain() > 0) {
    absl::StrAppendFormat(out, " gain -%.0f%%", f.predicted_gain() * 100);
  }
  absl::StrAppend(out, "\n");
  if (!f.summary().empty()) absl::StrAppend(out, "    ", f.summary(), "\n");
  if (!details) return;
  if (!f.fix().empty()) absl::StrAppend(out, "    fix: ", f.fix(), "\n");
  for (const auto& e : f.evidence()) {
    absl::StrAppendFormat(out, "    %-34s %12.6g   (%s)\n", e.name(), e.value(), e.series());
  }
}

}  // namespace

std::string FormatJobReport(const loom::v1::JobReport& report) {
  std::string out = absl::StrCat("Job:       ", report.job(), "\n");
  absl::StrAppend(&out, "Generation: ", report.generation(), "\n");
  if (report.has_goodput() && report.goodput().wall_seconds() > 0) {
    absl::StrAppend(&out, "Goodput:   ", FormatGoodput(report.goodput()), "\n");
  }
  if (!report.note().empty()) {
    absl::StrAppend(&out, "Note:      ", report.note(), "\n");
    return out;
  }
  absl::StrAppendFormat(&out, "Windows:   %d (step %.4f s, rank 0 median)\n", report.windows(),
                        report.step_seconds());
  if (report.findings().empty()) {
    absl::StrAppend(&out, "\nFindings: none\n");
  } else {
    absl::StrAppend(&out, "\nFindings:\n");
    for (const Finding& f : report.findings()) AppendFinding(&out, f, /*details=*/true);
  }
  if (!report.pending().empty()) {
    absl::StrAppend(&out, "\nPending (seen, not yet persistent):\n");
    for (const Finding& f : report.pending()) AppendFinding(&out, f, /*details=*/false);
  }
  if (report.stages_size() > 1) {
    absl::StrAppend(&out, "\nSTAGE  BLOCKS  BUSY_S    IDLE\n");
    for (const auto& s : report.stages()) {
      absl::StrAppendFormat(&out, "%-6d %-7d %-9.4f %.2f\n", s.stage(), s.blocks(),
                            s.busy_seconds(), s.idle_ratio());
    }
  }
  if (!report.ranks().empty()) {
    absl::StrAppend(&out,
                    "\nRANK  NODE                 STAGE  STEP_S    BUSY_S    IDLE  STRAGGLER\n");
    for (const auto& r : report.ranks()) {
      absl::StrAppendFormat(&out, "%-5d %-20s %-6d %-9.4f %-9.4f %-5.2f %.2f\n", r.rank(),
                            r.node().empty() ? "-" : r.node(), r.stage(), r.step_seconds(),
                            r.busy_seconds(), r.idle_ratio(), r.straggler_score());
    }
  }
  return out;
}

}  // namespace loom::client
