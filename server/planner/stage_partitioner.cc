#include "server/planner/stage_partitioner.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Prefix sums and per-stage accessors for C_i(a, b) and M_i(a, b).
class Sums {
 public:
  explicit Sums(const PartitionProblem& p) : p_(p) {
    const int n = static_cast<int>(p.block_cost.size());
    cost_.assign(n + 1, 0.0);
    for (int j = 0; j < n; ++j) cost_[j + 1] = cost_[j] + p.block_cost[j];
    has_memory_ = !p.block_static_bytes.empty();
    if (has_memory_) {
      static_.assign(n + 1, 0.0);
      act_.assign(n + 1, 0.0);
      for (int j = 0; j < n; ++j) {
        static_[j + 1] = static_[j] + p.block_static_bytes[j];
        act_[j + 1] = act_[j] + p.block_activation_bytes[j];
      }
    }
  }

  double Cost(int stage, int a, int b) const {
    double c = cost_[b] - cost_[a];
    if (stage == 0) c += p_.first_stage_cost;
    if (stage == p_.num_stages - 1) c += p_.last_stage_cost;
    return c;
  }

  double Bytes(int stage, int a, int b) const {
    if (!has_memory_) return 0.0;
    const double fixed = p_.stage_fixed_bytes.empty() ? 0.0 : p_.stage_fixed_bytes[stage];
    const double in_flight = p_.stage_in_flight.empty() ? 1.0 : p_.stage_in_flight[stage];
    return fixed + (static_[b] - static_[a]) + in_flight * (act_[b] - act_[a]);
  }

 private:
  const PartitionProblem& p_;
  std::vector<double> cost_, static_, act_;
  bool has_memory_ = false;
};

absl::Status Check(const PartitionProblem& p) {
  const int n = static_cast<int>(p.block_cost.size());
  if (p.num_stages < 1 || p.num_stages > n) {
    return absl::InvalidArgumentError(absl::StrCat("stages must be in [1, ", n, "] (one block at ",
                                                   "least per stage), got ", p.num_stages));
  }
  if (!p.block_static_bytes.empty() && (static_cast<int>(p.block_static_bytes.size()) != n ||
                                        static_cast<int>(p.block_activation_bytes.size()) != n)) {
    return absl::InvalidArgumentError(
        "block_static_bytes and block_activation_bytes need one "
        "entry per block");
  }
  if ((!p.stage_fixed_bytes.empty() &&
       static_cast<int>(p.stage_fixed_bytes.size()) != p.num_stages) ||
      (!p.stage_in_flight.empty() && static_cast<int>(p.stage_in_flight.size()) != p.num_stages)) {
    return absl::InvalidArgumentError(
        "stage_fixed_bytes and stage_in_flight need one entry per "
        "stage");
  }
  return absl::OkStatus();
}

// The min-max DP of the header, for an objective O(stage, a, b) and a feasibility test
// F(stage, a, b), both monotone: growing (resp. failing) as a decreases for fixed b.
// Returns false when no feasible partition exists.
template <typename Objective, typename Feasible>
bool MinMax(int n, int p, Objective objective, Feasible feasible, std::vector<int>* blocks) {
  const int w = n + 1;
  std::vector<double> best(static_cast<size_t>(p + 1) * w, kInf);
  std::vector<int> arg(static_cast<size_t>(p + 1) * w, -1);
  best[0] = 0.0;
  for (int i = 1; i <= p; ++i) {
    const int stage = i - 1;
    // Stages 0..i−1 cover [0, j): each needs a block, and the p − i later stages need theirs.
    for (int j = i; j <= n - (p - i); ++j) {
      double v_best = kInf;
      int k_best = -1;
      for (int k = j - 1; k >= i - 1; --k) {
        if (!feasible(stage, k, j)) break;
        const double c = objective(stage, k, j);
        if (c > v_best) break;
        const double prev = best[(i - 1) * w + k];
        if (prev == kInf) continue;
        const double v = std::max(prev, c);
        if (v <= v_best) {  // ties: the smaller k gives this (later) stage more blocks
          v_best = v;
          k_best = k;
        }
      }
      best[i * w + j] = v_best;
      arg[i * w + j] = k_best;
    }
  }
  if (best[p * w + n] == kInf) return false;
  blocks->assign(p, 0);
  int j = n;
  for (int i = p; i >= 1; --i) {
    const int k = arg[i * w + j];
    (*blocks)[i - 1] = j - k;
    j = k;
  }
  return true;
}

bool Uniform(const PartitionProblem& p) {
  auto all_equal = [](const std::vector<double>& v) {
    return std::all_of(v.begin(), v.end(), [&](double x) { return x == v.front(); });
  };
  return p.allow_uniform_shortcut && all_equal(p.block_cost) && all_equal(p.block_static_bytes) &&
         all_equal(p.block_activation_bytes);
}

// The uniform shortcut of the header. Stage i is worth alpha[i] + n·w[i] and holds at most
// cap[i] blocks. Returns false when no split exists.
bool UniformMinMax(int n, const std::vector<double>& alpha, const std::vector<double>& w,
                   const std::vector<int>& cap, std::vector<int>* blocks) {
  const int p = static_cast<int>(alpha.size());
  auto most = [&](int i, double t) -> int {  // blocks stage i may take under bottleneck t
    if (t < alpha[i] + w[i]) return 0;
    if (w[i] <= 0) return cap[i];
    double k = std::floor((t - alpha[i]) / w[i]);
    if (k >= cap[i]) return cap[i];
    // The division may round across an integer; settle k on the worth itself.
    while (k + 1 <= cap[i] && alpha[i] + (k + 1) * w[i] <= t) ++k;
    while (k > 0 && alpha[i] + k * w[i] > t) --k;
    return static_cast<int>(std::min<double>(k, cap[i]));
  };
  auto reachable = [&](double t) {
    int64_t total = 0;
    for (int i = 0; i < p; ++i) {
      const int k = most(i, t);
      if (k < 1) return false;
      total += k;
    }
    return total >= n;
  };
  double lo = 0, hi = 0;
  for (int i = 0; i < p; ++i) {
    if (cap[i] < 1) return false;
    lo = std::max(lo, alpha[i] + w[i]);
    hi = std::max(hi, alpha[i] + std::min(cap[i], n) * w[i]);
  }
  if (!reachable(hi)) return false;
  if (reachable(lo)) {
    hi = lo;
  } else {
    // Invariant: lo unreachable, hi reachable.
    for (int it = 0; it < 200 && hi - lo > 1e-13 * hi; ++it) {
      const double mid = lo + (hi - lo) / 2;
      if (mid <= lo || mid >= hi) break;
      (reachable(mid) ? hi : lo) = mid;
    }
  }
  // One block each, then the rest from the last stage backward (later stages get more).
  blocks->assign(p, 1);
  int rest = n - p;
  for (int i = p - 1; i >= 0 && rest > 0; --i) {
    const int add = std::min(rest, most(i, hi) - 1);
    (*blocks)[i] += add;
    rest -= add;
  }
  return rest == 0;
}

// Per-stage (alpha, w, cap) of a uniform problem for the time objective under the memory
// limit (memory = false) or for the memory objective without limit (memory = true).
bool SolveUniform(const PartitionProblem& p, bool memory, std::vector<int>* blocks) {
  const int n = static_cast<int>(p.block_cost.size()), stages = p.num_stages;
  const bool has_memory = !p.block_static_bytes.empty();
  std::vector<double> alpha(stages), w(stages);
  std::vector<int> cap(stages, n);
  for (int i = 0; i < stages; ++i) {
    const double fixed = p.stage_fixed_bytes.empty() ? 0.0 : p.stage_fixed_bytes[i];
    const double in_flight = p.stage_in_flight.empty() ? 1.0 : p.stage_in_flight[i];
    const double per_block =
        has_memory ? p.block_static_bytes[0] + in_flight * p.block_activation_bytes[0] : 0.0;
    if (memory) {
      alpha[i] = has_memory ? fixed : 0.0;
      w[i] = per_block;
      continue;
    }
    alpha[i] = (i == 0 ? p.first_stage_cost : 0.0) + (i == stages - 1 ? p.last_stage_cost : 0.0);
    w[i] = p.block_cost[0];
    if (has_memory && std::isfinite(p.capacity_bytes)) {
      const double room = p.capacity_bytes - fixed;
      if (room < 0) {
        cap[i] = 0;
      } else if (per_block > 0) {
        cap[i] = static_cast<int>(std::min<double>(n, std::floor(room / per_block)));
      }
    }
  }
  return UniformMinMax(n, alpha, w, cap, blocks);
}

std::string Gib(double bytes) {
  return absl::StrFormat("%.1f GiB", bytes / (1024.0 * 1024 * 1024));
}

}  // namespace

Partition EvaluatePartition(const PartitionProblem& problem, std::vector<int> blocks_per_stage) {
  Sums sums(problem);
  Partition r;
  int a = 0;
  for (int i = 0; i < static_cast<int>(blocks_per_stage.size()); ++i) {
    const int b = a + blocks_per_stage[i];
    r.stage_cost.push_back(sums.Cost(i, a, b));
    r.stage_bytes.push_back(sums.Bytes(i, a, b));
    a = b;
  }
  r.bottleneck = *std::max_element(r.stage_cost.begin(), r.stage_cost.end());
  r.peak_bytes = *std::max_element(r.stage_bytes.begin(), r.stage_bytes.end());
  r.blocks_per_stage = std::move(blocks_per_stage);
  return r;
}

absl::StatusOr<Partition> MinimizePeakMemory(const PartitionProblem& problem) {
  if (absl::Status s = Check(problem); !s.ok()) return s;
  std::vector<int> blocks;
  if (Uniform(problem) && SolveUniform(problem, /*memory=*/true, &blocks)) {
    return EvaluatePartition(problem, std::move(blocks));
  }
  Sums sums(problem);
  MinMax(
      static_cast<int>(problem.block_cost.size()), problem.num_stages,
      [&](int stage, int a, int b) { return sums.Bytes(stage, a, b); },
      [](int, int, int) { return true; }, &blocks);
  return EvaluatePartition(problem, std::move(blocks));
}

absl::StatusOr<Partition> PartitionStages(const PartitionProblem& problem) {
  if (absl::Status s = Check(problem); !s.ok()) return s;
  const double cap = problem.capacity_bytes;
  std::vector<int> blocks;
  if (Uniform(problem)) {
    if (SolveUniform(problem, /*memory=*/false, &blocks)) {
      return EvaluatePartition(problem, std::move(blocks));
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "no split of ", problem.block_cost.size(), " blocks into ", problem.num_stages,
        " stages fits ", Gib(cap), " per device (MinimizePeakMemory gives the least needed)"));
  }
  Sums sums(problem);
  const bool ok = MinMax(
      static_cast<int>(problem.block_cost.size()), problem.num_stages,
      [&](int stage, int a, int b) { return sums.Cost(stage, a, b); },
      [&](int stage, int a, int b) { return sums.Bytes(stage, a, b) <= cap; }, &blocks);
  if (!ok) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no split of ", problem.block_cost.size(), " blocks into ", problem.num_stages,
        " stages fits ", Gib(cap), " per device (MinimizePeakMemory gives the least needed)"));
  }
  return EvaluatePartition(problem, std::move(blocks));
}

}  // namespace loom::planner
