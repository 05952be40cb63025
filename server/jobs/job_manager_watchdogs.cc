// The JobManager's watchdogs (see JobManagerOptions): the progress watchdog, which turns a gang
// that stopped making progress (a stopped or deadlocked rank, a wedged collective) into stack
// dumps and a gang restart, and the start timeout, which re-places a gang that a worker accepted
// but never started.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/job_manager_helpers.h"

namespace loom::jobs {
namespace {

using internal::PlacementNodes;
using internal::RankPlacedOn;

// Ranks named one by one in a hang's event; the rest are counted (the logs have every dump).
constexpr int kRanksInSummary = 8;
// The most of one dump kept in memory (the whole dump is in the job's logs).
constexpr size_t kMaxDumpBytes = 16 * 1024;

// The line of a dump that names the last collectives, or empty.
std::string LastCollectives(const std::string& text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "last collectives:")) return std::string(line);
  }
  return "";
}

std::string DescribeDump(int rank, const v1::StackDump* dump) {
  if (dump == nullptr) return absl::StrCat("rank ", rank, ": no answer from its worker");
  if (dump->answered()) {
    const std::string last = LastCollectives(dump->text());
    return absl::StrCat("rank ", rank, " (pid ", dump->pid(), "): dumped",
                        last.empty() ? "" : absl::StrCat(", ", last));
  }
  const std::string state = dump->proc_state() == "T" || dump->proc_state() == "t"
                                ? absl::StrCat(dump->proc_state(), " (stopped)")
                                : dump->proc_state();
  return absl::StrCat("rank ", rank, " (pid ", dump->pid(), "): did not answer, process state ",
                      state);
}

}  // namespace

void JobManager::CheckProgressLocked(absl::Time now) {
  if (options_.progress_timeout_floor <= absl::ZeroDuration()) return;
  std::vector<std::string> to_stop;
  for (auto& [name, active] : gangs_) {
    if (active->job.state() != v1::RUNNING) continue;
    if (active->hung_stop_at.has_value()) {
      if (now >= *active->hung_stop_at) to_stop.push_back(name);
      continue;
    }
    absl::Duration timeout = options_.startup_allowance;
    std::string basis = "the start-up allowance, no step yet";
    if (active->stepped) {
      timeout = options_.progress_timeout_floor;
      basis = "the floor";
      if (std::optional<StepSample> median = active->step_times.Median(); median.has_value()) {
        const absl::Duration scaled =
            absl::Seconds(median->step * options_.progress_timeout_factor);
        if (scaled > timeout) {
          timeout = scaled;
          basis = absl::StrCat(options_.progress_timeout_factor, " x the median step of ",
                               absl::FormatDuration(absl::Seconds(median->step)));
        }
      }
    }
    // The most silent rank decides; a checkpoint being written speaks for every rank.
    int silent_rank = 0;
    absl::Time oldest = absl::InfiniteFuture();
    for (int rank = 0; rank < active->world_size; ++rank) {
      auto it = active->rank_progress.find(rank);
      const absl::Time last =
          std::max({active->last_progress, active->last_checkpoint,
                    it == active->rank_progress.end() ? absl::InfinitePast() : it->second});
      if (last < oldest) {
        oldest = last;
        silent_rank = rank;
      }
    }
    const absl::Duration silent = now - oldest;
    if (silent <= timeout) continue;
    active->hung_reason =
        absl::StrCat(active->world_size > 1 ? absl::StrCat("rank ", silent_rank, ": ") : "",
                     "no progress (step or checkpoint) for ", absl::FormatDuration(silent),
                     " (timeout ", absl::FormatDuration(timeout), ": ", basis, ")");
    active->hung_stop_at = now + options_.stack_dump_grace;
    active->dumps.clear();
    LOOM_LOG(WARNING) << name << " generation " << active->job.generation()
                      << " is hung: " << active->hung_reason << "; asking for stack dumps";
    v1::CoordinatorMessage message;
    v1::DumpStacks* dump = message.mutable_dump_stacks();
    dump->set_job(name);
    dump->set_generation(active->job.generation());
    dump->set_reason(active->hung_reason);
    for (const std::string& node : PlacementNodes(active->job)) nodes_.Send(node, message);
  }
  for (const std::string& name : to_stop) {
    auto it = active_.find(name);
    if (it != active_.end()) StopHungGangLocked(*it->second);
  }
}

void JobManager::StopHungGangLocked(ActiveJob& active) {
  std::vector<std::string> parts;
  for (int rank = 0; rank < active.world_size; ++rank) {
    if (static_cast<int>(parts.size()) == kRanksInSummary) {
      parts.push_back(absl::StrCat("and ", active.world_size - kRanksInSummary, " more ranks"));
      break;
    }
    auto it = active.dumps.find(rank);
    parts.push_back(DescribeDump(rank, it == active.dumps.end() ? nullptr : &it->second));
  }
  const std::string what =
      absl::StrCat(active.hung_reason, "; stacks: ", absl::StrJoin(parts, "; "),
                   " (the dumps are in the job's logs)");
  active.hung_stop_at.reset();
  FailGangLocked(active, /*retryable=*/true, what);
}

void JobManager::HandleStackDumpLocked(const std::string& node, const v1::StackDump& dump) {
  auto it = active_.find(dump.job());
  if (it == active_.end()) return;
  ActiveJob& active = *it->second;
  if (active.job.generation() != dump.generation() || !active.hung_stop_at.has_value() ||
      !RankPlacedOn(active.job, node, dump.rank())) {
    return;  // late or unasked: the logs still have the text
  }
  v1::StackDump& kept = active.dumps[dump.rank()] = dump;
  if (kept.text().size() > kMaxDumpBytes) kept.mutable_text()->resize(kMaxDumpBytes);
  if (kept.proc_state().size() > 4) kept.mutable_proc_state()->resize(4);
  if (static_cast<int>(active.dumps.size()) >= active.world_size) StopHungGangLocked(active);
}

void JobManager::CheckStartTimeoutsLocked(absl::Time now) {
  if (options_.start_timeout <= absl::ZeroDuration()) return;
  std::vector<std::string> late_jobs;
  for (const auto& [name, active] : gangs_) {
    if (active->job.state() == v1::SCHEDULED &&
        now - active->scheduled_at > options_.start_timeout) {
      late_jobs.push_back(name);
    }
  }
  for (const std::string& name : late_jobs) {
    ActiveJob& active = *active_.find(name)->second;
    std::vector<std::string> late_nodes;
    for (const v1::Placement& p : active.job.placements()) {
      const bool all_started = std::all_of(p.ranks().begin(), p.ranks().end(), [&](int rank) {
        return active.running_ranks.contains(rank) || active.succeeded_ranks.contains(rank);
      });
      if (all_started) continue;
      late_nodes.push_back(p.node());
      active.avoid_nodes.insert(p.node());
    }
    RequeueGangLocked(
        active,
        absl::StrCat("not every rank started within ", absl::FormatDuration(options_.start_timeout),
                     " (late: ", absl::StrJoin(late_nodes, ", "),
                     "); re-placing the gang, avoiding those nodes"),
        absl::ZeroDuration());
  }
}

}  // namespace loom::jobs
