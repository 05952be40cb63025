// Persistence and hysteresis of the doctor's findings (issue 12, part 2): a finding observed by
// the rules is raised only after it was seen in `raise_after` consecutive windows, and a raised
// finding clears only after it was absent from `clear_after` consecutive windows, so a finding
// never flaps on a noisy window. The rules add threshold hysteresis on top (a raised finding is
// kept at a lower threshold than the one that raises it; rules.h).
//
// Pure: state in, state out.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "loom/v1/job.pb.h"

namespace loom::doctor {

// "KIND|subject": what identifies one finding across windows.
std::string FindingKey(const v1::Finding& finding);
// "STAGE_IMBALANCE" and so on: the kind without its enum prefix (the metric label).
std::string KindName(v1::FindingKind kind);
// "info", "warning", "critical".
std::string SeverityName(v1::FindingSeverity severity);

struct TrackerOptions {
  int raise_after = 3;
  int clear_after = 3;
};

struct TrackedFinding {
  v1::Finding finding;  // the latest observation (or, once absent, the last one seen)
  int seen = 0;         // consecutive windows observed
  int absent = 0;       // consecutive windows not observed (raised findings only)
  bool raised = false;
};

struct TrackerState {
  std::map<std::string, TrackedFinding> entries;  // by FindingKey
  int windows = 0;                                // windows tracked
  // The keys of the raised findings (what the rules keep at their lower threshold).
  std::set<std::string> RaisedKeys() const;
};

struct TrackerUpdate {
  TrackerState state;
  std::vector<v1::Finding> raised;   // raised in this window
  std::vector<v1::Finding> cleared;  // cleared in this window (the last observation)
};

// Folds one window's observed findings into `state`.
TrackerUpdate Track(TrackerState state, const std::vector<v1::Finding>& observed,
                    const TrackerOptions& options = {});

}  // namespace loom::doctor
