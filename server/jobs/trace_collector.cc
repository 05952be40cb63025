#include "server/jobs/trace_collector.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::jobs {
namespace {

// A worker's note is kept to this length, and a request keeps at most this many notes.
constexpr size_t kMaxNoteBytes = 512;
constexpr size_t kMaxNotes = 256;

}  // namespace

absl::StatusOr<uint64_t> TraceCollector::Open(std::map<std::string, std::set<int>> ranks_by_node,
                                              size_t max_events) {
  absl::MutexLock lock(&mu_);
  if (pending_.size() >= kMaxOpen) {
    return absl::ResourceExhaustedError(absl::StrCat(
        kMaxOpen, " trace requests are in flight on this loomd; try again in a few seconds"));
  }
  const uint64_t id = next_id_++;
  Pending& p = pending_[id];
  p.ranks_by_node = std::move(ranks_by_node);
  p.max_events = max_events;
  return id;
}

void TraceCollector::Accept(const std::string& node, const v1::TraceChunk& chunk) {
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(chunk.request_id());
  if (it == pending_.end()) return;  // finished (timed out) or never asked
  Pending& p = it->second;
  auto ranks = p.ranks_by_node.find(node);
  if (ranks == p.ranks_by_node.end() || p.result.answered.contains(node)) return;
  const bool rank_ok = ranks->second.contains(chunk.rank());
  if (rank_ok) {
    std::vector<v1::TraceEvent>& kept = p.result.events[chunk.rank()];
    for (const v1::TraceEvent& e : chunk.events()) {
      if (p.events >= p.max_events) {
        p.result.truncated = true;
        break;
      }
      kept.push_back(e);
      ++p.events;
    }
  }
  if (!chunk.last()) return;
  for (const std::string& note : chunk.notes()) {
    if (p.result.notes.size() >= kMaxNotes) break;
    p.result.notes.push_back(absl::StrCat(node, ": ", note.substr(0, kMaxNoteBytes)));
  }
  p.result.answered.insert(node);
}

TraceCollector::Result TraceCollector::Wait(uint64_t id, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto done = [this, id]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    auto it = pending_.find(id);
    return it == pending_.end() ||
           it->second.result.answered.size() == it->second.ranks_by_node.size();
  };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  Result out;
  auto it = pending_.find(id);
  if (it == pending_.end()) return out;
  out = std::move(it->second.result);
  pending_.erase(it);
  return out;
}

}  // namespace loom::jobs
