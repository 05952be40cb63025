#include "server/planner/plan_explanation.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/planner/time_model.h"

namespace loom::planner {
namespace {

std::string Family(const FamilyOutcome& f) {
  return absl::StrCat("tp=", f.tp, " pp=", f.pp, " dp=", f.dp);
}

std::string Percent(double fraction) { return absl::StrFormat("%.0f%%", 100.0 * fraction); }

// The settings that set a layout apart from the plain one, for "even with ...".
std::string MemorySavers(const Layout& l) {
  std::vector<std::string> parts = {absl::StrCat("micro_batch=", l.micro_batch)};
  if (l.recompute != Recompute::kNone) {
    parts.push_back(absl::StrCat("recompute=", RecomputeName(l.recompute)));
  }
  if (l.zero1) parts.push_back("zero1=on");
  return absl::StrJoin(parts, ", ");
}

}  // namespace

std::string FormatGiB(double bytes) { return absl::StrFormat("%.1f GiB", bytes / kGiB); }

std::string FormatSeconds(double s) {
  if (s < 1e-3) return absl::StrFormat("%.0f µs", s * 1e6);
  if (s < 1.0) return absl::StrFormat("%.0f ms", s * 1e3);
  return absl::StrFormat("%.2f s", s);
}

std::string DeviceNoun(const DeviceSpec& d) { return d.model == "cpu" ? "CPU device" : "GPU"; }

std::string ExplainFamily(const FamilyOutcome& f, const Evaluation& best, const ModelShape& model,
                          const DeviceSpec& d, int64_t global_batch_sequences,
                          const std::vector<int>& micro_batch_sizes) {
  const std::string family = Family(f);
  if (!f.batch_splits) {
    return absl::StrCat(family, ": ", global_batch_sequences, " sequences do not split into ", f.dp,
                        " data-parallel ranks × micro_batch {",
                        absl::StrJoin(micro_batch_sizes, ","), "}");
  }
  if (!f.fastest) {
    if (!f.least_memory) return absl::StrCat(family, ": not evaluated");
    const Evaluation& e = *f.least_memory;
    return absl::StrCat(family, ": needs ", FormatGiB(e.peak_memory.total()), " per ",
                        DeviceNoun(d), " > ", FormatGiB(d.memory_bytes), " even with ",
                        MemorySavers(e.layout));
  }

  const Evaluation& e = *f.fastest;
  const StepTime& t = e.time;
  const StepTime& b = best.time;
  const std::string slower = absl::StrCat(", +", Percent(t.total / b.total - 1.0), " step time");

  const Link tp_link = GroupLink(d, f.tp, 1);
  if (f.tp > 1 && tp_link.spans_nodes) {
    return absl::StrCat(family, ": tensor groups span ", tp_link.nodes,
                        " nodes, all-reduce over the network", slower);
  }
  if (t.total <= b.total * 1.005) {
    return absl::StrCat(family, ": within 0.5% of the best (", FormatSeconds(t.total), " vs ",
                        FormatSeconds(b.total), "), less memory headroom");
  }

  // The phase that grew the most against the best layout names the reason.
  struct Term {
    const char* name;
    double delta;
  };
  const double compute_t = t.forward + t.backward - t.recompute;
  const double compute_b = b.forward + b.backward - b.recompute;
  const Term terms[] = {
      {"bubble", t.bubble - b.bubble},
      {"tp", t.tp_comm - b.tp_comm},
      {"pp", t.pp_comm - b.pp_comm},
      {"dp", t.dp_exposed - b.dp_exposed},
      {"recompute", t.recompute - b.recompute},
      {"compute", compute_t - compute_b},
      {"optimizer", t.optimizer - b.optimizer},
  };
  const Term* top =
      std::max_element(std::begin(terms), std::end(terms),
                       [](const Term& x, const Term& y) { return x.delta < y.delta; });
  const std::string what = top->name;
  if (what == "bubble") {
    const int m = e.layout.num_micro_batches;
    return absl::StrCat(family, ": ", m, m == 1 ? " micro-batch" : " micro-batches", " over ", f.pp,
                        " stages, ", Percent(t.bubble_fraction), " bubble", slower);
  }
  if (what == "tp") {
    return absl::StrCat(family, ": tensor all-reduces take ", Percent(t.tp_comm / t.total),
                        " of the step", slower);
  }
  if (what == "pp") {
    return absl::StrCat(family, ": pipeline send/recv takes ", Percent(t.pp_comm / t.total),
                        " of the step", slower);
  }
  if (what == "dp") {
    const Link dp_link = GroupLink(d, f.dp, f.tp);
    return absl::StrCat(family, ": gradient all-reduce over dp=", f.dp,
                        dp_link.spans_nodes ? absl::StrCat(" (", dp_link.nodes, " nodes)") : "",
                        " leaves ", FormatSeconds(t.dp_exposed), " exposed after backward", slower);
  }
  if (what == "recompute") {
    return absl::StrCat(family, ": fits only with recompute=", RecomputeName(e.layout.recompute),
                        " (", FormatSeconds(t.recompute), " recomputing)", slower);
  }
  if (what == "optimizer") {
    return absl::StrCat(family, ": optimizer step takes ", FormatSeconds(t.optimizer), slower);
  }
  // Compute: narrower GEMMs per device run further from peak, or the stages are unbalanced.
  const EfficiencyTable& eff = d.efficiency;
  const double smallest =
      std::min(double(e.layout.micro_batch) * model.seq_len, double(model.hidden) / f.tp);
  const double best_smallest = std::min(double(best.layout.micro_batch) * model.seq_len,
                                        double(model.hidden) / best.layout.tp);
  if (eff.GemmFraction(smallest) < eff.GemmFraction(best_smallest)) {
    return absl::StrCat(family, ": GEMMs ", absl::StrFormat("%.0f", smallest),
                        " wide per device run at ", Percent(eff.GemmFraction(smallest)),
                        " of peak (best: ", Percent(eff.GemmFraction(best_smallest)), ")", slower);
  }
  if (t.stage_imbalance > 1.02) {
    return absl::StrCat(family, ": unbalanced stages, the slowest ",
                        absl::StrFormat("%.2f", t.stage_imbalance), "× the mean", slower);
  }
  return absl::StrCat(family, ": compute ", FormatSeconds(compute_t), " vs ",
                      FormatSeconds(compute_b), slower);
}

}  // namespace loom::planner
