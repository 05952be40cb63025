#include "server/planner/layout_search.h"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/planner/plan_explanation.h"

namespace loom::planner {
namespace {

constexpr Recompute kRecomputeOrder[] = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};

std::vector<int> Divisors(int n) {
  std::vector<int> out;
  for (int k = 1; k <= n; ++k) {
    if (n % k == 0) out.push_back(k);
  }
  return out;
}

bool Contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}
bool Contains(const std::vector<Recompute>& v, Recompute x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Fastest first; then more headroom; then the smaller layout, for a deterministic order.
bool Better(const Evaluation& a, const Evaluation& b) {
  if (a.time.total != b.time.total) return a.time.total < b.time.total;
  if (a.headroom_bytes != b.headroom_bytes) return a.headroom_bytes > b.headroom_bytes;
  const Layout &x = a.layout, &y = b.layout;
  return std::tie(x.tp, x.pp, x.micro_batch, x.recompute, x.zero1) <
         std::tie(y.tp, y.pp, y.micro_batch, y.recompute, y.zero1);
}

bool Matches(const Layout& l, const LayoutConstraints& c) {
  return (!c.tp || *c.tp == l.tp) && (!c.pp || *c.pp == l.pp) && (!c.dp || *c.dp == l.dp) &&
         (!c.micro_batch || *c.micro_batch == l.micro_batch) &&
         (!c.recompute || *c.recompute == l.recompute) && (!c.zero1 || *c.zero1 == l.zero1);
}

int MatchCount(const Layout& l, const LayoutConstraints& c) {
  return (c.tp && *c.tp == l.tp) + (c.pp && *c.pp == l.pp) + (c.dp && *c.dp == l.dp) +
         (c.micro_batch && *c.micro_batch == l.micro_batch) +
         (c.recompute && *c.recompute == l.recompute) + (c.zero1 && *c.zero1 == l.zero1);
}

std::string ConstraintString(const LayoutConstraints& c) {
  std::vector<std::string> parts;
  if (c.tp) parts.push_back(absl::StrCat("tensor=", *c.tp));
  if (c.pp) parts.push_back(absl::StrCat("pipeline=", *c.pp));
  if (c.dp) parts.push_back(absl::StrCat("data=", *c.dp));
  if (c.micro_batch) parts.push_back(absl::StrCat("micro_batch=", *c.micro_batch));
  if (c.recompute) parts.push_back(absl::StrCat("recompute=", RecomputeName(*c.recompute)));
  if (c.zero1) parts.push_back(absl::StrCat("zero1=", *c.zero1 ? "on" : "off"));
  return absl::StrJoin(parts, " ");
}

bool ValidTp(const ModelShape& m, int count, int tp) {
  return tp >= 1 && m.heads % tp == 0 && (4 * m.hidden) % tp == 0 && count % tp == 0;
}

absl::StatusOr<int64_t> GlobalSequences(const BatchSpec& b, const ModelShape& m) {
  if ((b.global_batch_sequences > 0) == (b.global_batch_tokens > 0)) {
    return absl::InvalidArgumentError(
        "give exactly one of train.global_batch_tokens and the global batch in sequences, > 0");
  }
  if (b.global_batch_sequences > 0) return b.global_batch_sequences;
  if (b.global_batch_tokens % m.seq_len != 0) {
    const int64_t below = b.global_batch_tokens / m.seq_len * m.seq_len;
    return absl::InvalidArgumentError(absl::StrCat(
        "train.global_batch_tokens ", b.global_batch_tokens, " is not a multiple of seq_len ",
        m.seq_len, ": use ", below > 0 ? absl::StrCat(below, " or ") : "", below + m.seq_len));
  }
  return b.global_batch_tokens / m.seq_len;
}

absl::Status ValidateConstraints(const ModelShape& m, const DeviceSpec& d,
                                 const LayoutConstraints& c) {
  const int n = d.count;
  if (c.tp && !ValidTp(m, n, *c.tp)) {
    const int g = std::gcd(std::gcd(m.heads, 4 * m.hidden), n);
    int below = 1, above = 0;
    for (int k : Divisors(g)) {
      if (k <= *c.tp) below = k;
      if (k >= *c.tp && above == 0) above = k;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.tensor ", *c.tp, " must divide model.heads ", m.heads,
                     ", the MLP width ", 4 * m.hidden, " and the ", n, " devices: use tensor ",
                     below, above > 0 && above != below ? absl::StrCat(" or ", above) : ""));
  }
  if (c.pp && (*c.pp < 1 || *c.pp > m.layers)) {
    return absl::InvalidArgumentError(absl::StrCat("parallelism.pipeline ", *c.pp,
                                                   " must be in [1, model.layers ", m.layers,
                                                   "]: use pipeline ", std::min(m.layers, n)));
  }
  if (c.dp && (*c.dp < 1 || n % *c.dp != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.data ", *c.dp, " must divide the ", n, " devices"));
  }
  const int tp = c.tp.value_or(1), pp = c.pp.value_or(1), dp = c.dp.value_or(1);
  if (n % (int64_t{tp} * pp * dp) != 0 || (c.tp && c.pp && c.dp && tp * pp * dp != n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism: ", ConstraintString(c), " does not multiply to the ", n,
                     " devices (data × tensor × pipeline = devices)"));
  }
  if (c.micro_batch && *c.micro_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.micro_batch must be >= 1, got ", *c.micro_batch));
  }
  return absl::OkStatus();
}

// Whether any layout of `d` fits memory with the strongest savings allowed. Only memory
// matters here, so the number of micro-batches is rounded up rather than required to divide.
bool AnyLayoutFits(const PlanRequest& r, const DeviceSpec& d, Recompute recompute, bool zero1,
                   int micro_batch, int64_t sequences) {
  for (int tp : Divisors(std::min(d.count, d.per_node))) {
    if (!ValidTp(r.model, d.count, tp)) continue;
    for (int pp : Divisors(d.count / tp)) {
      if (pp > r.model.layers) break;
      Layout l;
      l.tp = tp;
      l.pp = pp;
      l.dp = d.count / (tp * pp);
      l.micro_batch = micro_batch;
      l.num_micro_batches =
          static_cast<int>(std::max<int64_t>(1, sequences / (int64_t{l.dp} * micro_batch)));
      l.recompute = recompute;
      l.zero1 = zero1 && l.dp > 1;
      l.schedule = r.options.schedule;
      if (EvaluateLayout(r.model, r.precision, d, l).fits) return true;
    }
  }
  return false;
}

// FAILED_PRECONDITION for a model that fits no layout, naming the least it needs and what
// would make it fit.
absl::Status NothingFits(const PlanRequest& r, const std::vector<int>& sizes,
                         const std::optional<Evaluation>& least, int64_t sequences) {
  const DeviceSpec& d = r.devices;
  const Recompute strongest = Contains(r.options.recompute, Recompute::kFull) ? Recompute::kFull
                              : Contains(r.options.recompute, Recompute::kSelective)
                                  ? Recompute::kSelective
                                  : Recompute::kNone;
  const int smallest_b = *std::min_element(sizes.begin(), sizes.end());
  std::vector<std::string> fixes;
  for (int64_t count = int64_t{d.count} * 2; count <= int64_t{d.count} << 12; count *= 2) {
    DeviceSpec more = d;
    more.count = static_cast<int>(count);
    if (AnyLayoutFits(r, more, strongest, r.options.allow_zero1, smallest_b, sequences)) {
      fixes.push_back(absl::StrCat("needs at least ", count, " ", DeviceNoun(d), "s of ",
                                   FormatGiB(d.memory_bytes)));
      break;
    }
  }
  if (strongest != Recompute::kFull &&
      AnyLayoutFits(r, d, Recompute::kFull, r.options.allow_zero1, smallest_b, sequences)) {
    fixes.push_back("recompute: full");
  }
  if (!r.options.allow_zero1 && AnyLayoutFits(r, d, strongest, true, smallest_b, sequences)) {
    fixes.push_back("zero1: on");
  }
  if (smallest_b > 1 && AnyLayoutFits(r, d, strongest, r.options.allow_zero1, 1, sequences)) {
    fixes.push_back("micro_batch: 1");
  }
  std::string msg =
      absl::StrCat("model ", r.model.name, " does not fit ", d.count, " ", DeviceNoun(d), "s of ",
                   FormatGiB(d.memory_bytes), " under any layout");
  if (least) {
    absl::StrAppend(&msg, ": the least memory is ", FormatGiB(least->peak_memory.total()), " per ",
                    DeviceNoun(d), ", with ", LayoutString(least->layout));
  }
  if (!fixes.empty()) absl::StrAppend(&msg, "; ", absl::StrJoin(fixes, ", or "));
  return absl::FailedPreconditionError(msg);
}

}  // namespace

absl::StatusOr<PlanResult> PlanLayouts(const PlanRequest& r) {
  const ModelShape& m = r.model;
  const DeviceSpec& d = r.devices;
  const LayoutConstraints& fixed = r.fixed;
  if (absl::Status s = ValidateModel(m); !s.ok()) return s;
  if (absl::Status s = ValidateDevices(d); !s.ok()) return s;
  absl::StatusOr<int64_t> sequences = GlobalSequences(r.batch, m);
  if (!sequences.ok()) return sequences.status();
  const int64_t batch = *sequences;
  std::vector<int> allowed_b = r.batch.micro_batch_sizes;
  if (allowed_b.empty()) allowed_b = {1, 2, 4, 8, 16, 32};
  std::sort(allowed_b.begin(), allowed_b.end());
  allowed_b.erase(std::unique(allowed_b.begin(), allowed_b.end()), allowed_b.end());
  if (allowed_b.front() < 1) {
    return absl::InvalidArgumentError("micro_batch sizes must be >= 1");
  }
  if (r.options.recompute.empty()) {
    return absl::InvalidArgumentError("options.recompute must allow at least one mode");
  }
  if (absl::Status s = ValidateConstraints(m, d, fixed); !s.ok()) return s;
  std::vector<int> sizes = allowed_b;
  if (fixed.micro_batch && !Contains(sizes, *fixed.micro_batch)) {
    sizes.push_back(*fixed.micro_batch);
  }

  // tp values: within a node, plus a fixed one, plus the first beyond a node (to explain).
  std::vector<int> tps;
  int explain_tp = 0;
  for (int tp : Divisors(d.count)) {
    if (!ValidTp(m, d.count, tp)) continue;
    const bool regular = tp <= d.per_node;
    if (!regular && explain_tp == 0 && !(fixed.tp && *fixed.tp == tp)) explain_tp = tp;
    if (regular || tp == explain_tp || (fixed.tp && *fixed.tp == tp)) tps.push_back(tp);
  }

  PlanResult result;
  result.global_batch_sequences = batch;
  std::vector<Evaluation> unconstrained, constrained;
  std::vector<FamilyOutcome> families;
  std::optional<Evaluation> least_unconstrained, least_constrained;
  bool any_constrained_candidate = false;

  for (int tp : tps) {
    const bool regular = tp <= d.per_node;
    const bool explain = tp == explain_tp;
    for (int pp : Divisors(d.count / tp)) {
      if (pp > m.layers) break;
      FamilyOutcome fam;
      fam.tp = tp;
      fam.pp = pp;
      fam.dp = d.count / (tp * pp);
      // Memory only grows with the micro-batch (b·min(pp − i, m) = min(b·(pp − i), batch/dp)),
      // so once nothing fits at some b, no larger b fits either.
      bool too_big = false;
      for (int b : sizes) {
        if (batch % (int64_t{fam.dp} * b) != 0) continue;
        const bool b_allowed = Contains(allowed_b, b);
        fam.batch_splits |= b_allowed;
        bool shown_evaluated = false, shown_fits = false;
        for (bool zero1 : {false, true}) {
          if (zero1 && fam.dp == 1 && !(fixed.zero1 && *fixed.zero1)) continue;
          bool weaker_fits = false;  // see the pruning rule in the header
          for (Recompute rc : kRecomputeOrder) {
            Layout l;
            l.dp = fam.dp;
            l.tp = tp;
            l.pp = pp;
            l.micro_batch = b;
            l.num_micro_batches = static_cast<int>(batch / (int64_t{fam.dp} * b));
            l.recompute = rc;
            l.zero1 = zero1;
            l.schedule = r.options.schedule;
            const bool in_options =
                b_allowed && Contains(r.options.recompute, rc) && (!zero1 || r.options.allow_zero1);
            const bool uncon = regular && in_options;
            const bool shown = uncon || (explain && in_options);
            const bool con = fixed.any() && Matches(l, fixed);
            any_constrained_candidate |= con;
            if (!con && (!shown || weaker_fits || too_big)) continue;
            Evaluation ev = EvaluateLayout(m, r.precision, d, l);
            ++result.layouts_evaluated;
            shown_evaluated |= shown;
            if (ev.fits) {
              weaker_fits |= shown;
              shown_fits |= shown;
              if (shown && (!fam.fastest || Better(ev, *fam.fastest))) fam.fastest = ev;
              if (con) constrained.push_back(ev);
              if (uncon) unconstrained.push_back(std::move(ev));
              continue;
            }
            const double need = ev.peak_memory.total();
            if (shown && (!fam.least_memory || need < fam.least_memory->peak_memory.total())) {
              fam.least_memory = ev;
            }
            if (uncon &&
                (!least_unconstrained || need < least_unconstrained->peak_memory.total())) {
              least_unconstrained = ev;
            }
            if (con && (!least_constrained || need < least_constrained->peak_memory.total())) {
              least_constrained = std::move(ev);
            }
          }
        }
        too_big |= shown_evaluated && !shown_fits;
      }
      if (regular || explain) families.push_back(std::move(fam));
    }
  }

  if (unconstrained.empty()) {
    const bool any_split = std::any_of(families.begin(), families.end(),
                                       [](const FamilyOutcome& f) { return f.batch_splits; });
    if (!any_split) {
      // The nearest batch that some dp × micro_batch divides.
      auto splits = [&](int64_t seqs) {
        for (const FamilyOutcome& f : families) {
          for (int b : allowed_b) {
            if (seqs % (int64_t{f.dp} * b) == 0) return true;
          }
        }
        return false;
      };
      int64_t below = batch - 1, above = batch + 1;
      while (below > 0 && !splits(below)) --below;
      while (!splits(above)) ++above;
      return absl::InvalidArgumentError(absl::StrCat(
          "global batch of ", batch, " sequences does not split into data-parallel ranks × ",
          "micro_batch {", absl::StrJoin(allowed_b, ","), "} for any layout of ", d.count,
          " devices: use ", below > 0 ? absl::StrCat(below, " or ") : "", above, " sequences (",
          (below > 0 ? below : above) * m.seq_len, " tokens)"));
    }
    return NothingFits(r, allowed_b, least_unconstrained, batch);
  }
  std::sort(unconstrained.begin(), unconstrained.end(), Better);
  std::sort(constrained.begin(), constrained.end(), Better);
  const Evaluation& best = unconstrained.front();

  if (fixed.any() && constrained.empty()) {
    if (!any_constrained_candidate) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no layout of ", d.count, " devices with ", ConstraintString(fixed),
          " splits the global batch of ", batch, " sequences into data × micro_batch; the best ",
          "without them: ", LayoutString(best.layout)));
    }
    const Evaluation* closest = &best;
    for (const Evaluation& e : unconstrained) {
      if (MatchCount(e.layout, fixed) > MatchCount(closest->layout, fixed)) closest = &e;
    }
    std::string need;
    if (least_constrained) {
      need = absl::StrCat(": needs ", FormatGiB(least_constrained->peak_memory.total()), " per ",
                          DeviceNoun(d), " > ", FormatGiB(d.memory_bytes), " at least (",
                          LayoutString(least_constrained->layout), ")");
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "the fixed layout ", ConstraintString(fixed), " does not fit", need, "; closest feasible: ",
        LayoutString(closest->layout), " (", FormatSeconds(closest->time.total), " per step)"));
  }

  const std::vector<Evaluation>& pool = fixed.any() ? constrained : unconstrained;
  const int k = std::max(1, r.options.top_k);
  result.ranked.assign(pool.begin(), pool.begin() + std::min<size_t>(k, pool.size()));
  if (fixed.any()) result.best_unconstrained = best;

  // One reason per family that did not make the ranking, the closest to the best first.
  auto shown = [&](const FamilyOutcome& f) {
    auto same = [&](const Evaluation& e) { return e.layout.tp == f.tp && e.layout.pp == f.pp; };
    return std::any_of(result.ranked.begin(), result.ranked.end(), same) ||
           (result.best_unconstrained && same(*result.best_unconstrained));
  };
  std::vector<const FamilyOutcome*> order;
  for (const FamilyOutcome& f : families) {
    if (!shown(f)) order.push_back(&f);
  }
  auto rank = [](const FamilyOutcome* f) {
    if (f->fastest) return std::make_tuple(0, f->fastest->time.total);
    if (f->least_memory) return std::make_tuple(1, f->least_memory->peak_memory.total());
    return std::make_tuple(2, 0.0);
  };
  std::stable_sort(order.begin(), order.end(), [&](const FamilyOutcome* a, const FamilyOutcome* b) {
    return rank(a) < rank(b);
  });
  for (const FamilyOutcome* f : order) {
    result.rejected.push_back(
        {f->tp, f->pp, f->dp, ExplainFamily(*f, best, m, d, batch, allowed_b)});
  }
  return result;
}

}  // namespace loom::planner
