#include "server/doctor/finding_tracker.h"

#include <utility>

namespace loom::doctor {

std::string KindName(v1::FindingKind kind) {
  switch (kind) {
    case v1::STAGE_IMBALANCE:
      return "STAGE_IMBALANCE";
    case v1::STRAGGLER:
      return "STRAGGLER";
    case v1::EXPOSED_COMMUNICATION:
      return "EXPOSED_COMMUNICATION";
    case v1::LAYOUT:
      return "LAYOUT";
    case v1::MEMORY:
      return "MEMORY";
    case v1::NO_PROFILE:
      return "NO_PROFILE";
    default:
      return "UNSPECIFIED";
  }
}

std::string SeverityName(v1::FindingSeverity severity) {
  switch (severity) {
    case v1::FINDING_SEVERITY_INFO:
      return "info";
    case v1::FINDING_SEVERITY_WARNING:
      return "warning";
    case v1::FINDING_SEVERITY_CRITICAL:
      return "critical";
    default:
      return "unspecified";
  }
}

std::string FindingKey(const v1::Finding& finding) {
  return KindName(finding.kind()) + "|" + finding.subject();
}

std::set<std::string> TrackerState::RaisedKeys() const {
  std::set<std::string> keys;
  for (const auto& [key, entry] : entries) {
    if (entry.raised) keys.insert(key);
  }
  return keys;
}

TrackerUpdate Track(TrackerState state, const std::vector<v1::Finding>& observed,
                    const TrackerOptions& options) {
  TrackerUpdate update;
  ++state.windows;
  std::set<std::string> seen_now;
  for (const v1::Finding& f : observed) {
    const std::string key = FindingKey(f);
    if (!seen_now.insert(key).second) continue;  // one observation per key and window
    TrackedFinding& e = state.entries[key];
    e.finding = f;
    ++e.seen;
    e.absent = 0;
    e.finding.set_windows(e.seen);
    if (!e.raised && e.seen >= options.raise_after) {
      e.raised = true;
      update.raised.push_back(e.finding);
    }
  }
  for (auto it = state.entries.begin(); it != state.entries.end();) {
    TrackedFinding& e = it->second;
    if (seen_now.count(it->first)) {
      ++it;
      continue;
    }
    if (!e.raised) {  // a pending finding that did not persist starts over
      it = state.entries.erase(it);
      continue;
    }
    e.seen = 0;
    if (++e.absent >= options.clear_after) {
      update.cleared.push_back(e.finding);
      it = state.entries.erase(it);
      continue;
    }
    ++it;
  }
  update.state = std::move(state);
  return update;
}

}  // namespace loom::doctor
