#include "server/planner/layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace loom::planner {

absl::string_view RecomputeName(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "none";
}

absl::StatusOr<Recompute> ParseRecompute(absl::string_view name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  return absl::InvalidArgumentError(
      absl::StrCat("recompute \"", name, "\" is not one of: none, selective, full"));
}

absl::string_view ScheduleName(Schedule s) { return s == Schedule::k1F1B ? "1f1b" : "gpipe"; }

absl::StatusOr<Schedule> ParseSchedule(absl::string_view name) {
  if (name == "1f1b") return Schedule::k1F1B;
  if (name == "gpipe") return Schedule::kGPipe;
  return absl::InvalidArgumentError(
      absl::StrCat("schedule \"", name, "\" is not one of: 1f1b, gpipe"));
}

std::string LayoutString(const Layout& l) {
  return absl::StrCat("tp=", l.tp, " pp=", l.pp, " dp=", l.dp, " micro_batch=", l.micro_batch,
                      " micro_batches=", l.num_micro_batches,
                      " recompute=", RecomputeName(l.recompute), " zero1=", l.zero1 ? "on" : "off",
                      " ", ScheduleName(l.schedule));
}

int MicroBatchesInFlight(const Layout& l, int stage) {
  if (l.schedule == Schedule::kGPipe) return l.num_micro_batches;
  return std::min(l.pp - stage, l.num_micro_batches);
}

double BubbleFraction(int pp, int num_micro_batches) {
  return double(pp - 1) / double(num_micro_batches + pp - 1);
}

}  // namespace loom::planner
