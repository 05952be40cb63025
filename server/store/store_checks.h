// Argument checks and helpers shared by the JobStore implementations, so that both reject the
// same inputs with the same errors (the conformance suite asserts they do). Internal to
// server/store/.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"

namespace loom::store {

// True for the states ListActiveJobs returns: every state that is not terminal.
inline bool IsActiveState(v1::JobState state) {
  return state == v1::QUEUED || state == v1::SCHEDULED || state == v1::RUNNING ||
         state == v1::RESTARTING;
}

// The job as stored: events live in their own log, never inside the job record.
inline v1::Job StripEvents(const v1::Job& job) {
  v1::Job stripped = job;
  stripped.clear_events();
  return stripped;
}

// `prefix` + non-empty id, e.g. "jobs/abc". The ids themselves are checked by the job manager.
inline absl::Status CheckResourceName(std::string_view name, std::string_view prefix,
                                      std::string_view field) {
  // std::string copies: this Abseil's StrCat takes absl::string_view, not std::string_view.
  if (name.substr(0, prefix.size()) != prefix || name.size() == prefix.size()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(field), ": \"", std::string(name),
                                                   "\" is not a ", std::string(prefix),
                                                   "{id} resource name"));
  }
  return absl::OkStatus();
}

inline absl::Status CheckJobForWrite(const v1::Job& job) {
  return CheckResourceName(job.name(), "jobs/", "job.name");
}

inline absl::Status CheckNodeForWrite(const v1::Node& node) {
  return CheckResourceName(node.name(), "nodes/", "node.name");
}

inline absl::Status CheckListLimit(int limit) {
  if (limit < 1) {
    return absl::InvalidArgumentError(absl::StrCat("limit: ", limit, " must be at least 1"));
  }
  return absl::OkStatus();
}

}  // namespace loom::store
