// State-directory guard: keeps loomd from starting as a fresh coordinator on a database that was
// lost (deleted, truncated to zero bytes, replaced by an empty file) while its state directory
// shows that it held jobs. Starting fresh there would forget every job and, through the
// reconciliation of the workers' hellos, kill every gang still running.
//
// Evidence that the directory held jobs: the marker file kHeldJobsMarker (written by
// MarkStateDirHeldJobs when the first job is stored, and at every start-up over a database that
// holds jobs) or a non-empty logs/ directory (job logs). The database counts as lost when it is
// missing, empty (0 bytes), a SQLite file without Loom's schema, or Loom's schema with no job.
//
// Contract: CheckStateDir runs before the store is opened (which would create a fresh schema)
// and writes nothing.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::store {

// The marker's file name inside the state directory.
inline constexpr char kHeldJobsMarker[] = "loomd.held-jobs";

struct StateDirVerdict {
  // True when the database was lost over a directory that held jobs and `start_fresh` let loomd
  // start anyway: unknown gangs that workers report are then quarantined, not killed.
  bool fresh_over_history = false;
  // What was found, for the log (empty when the database is fine or the directory is new).
  std::string finding;
};

// FAILED_PRECONDITION naming --start-fresh when the database at `db_path` is lost and
// `state_dir` shows it held jobs, unless `start_fresh`. DATA_LOSS-like problems of a damaged
// file are left to the store's own checks (it refuses foreign or corrupt files).
absl::StatusOr<StateDirVerdict> CheckStateDir(const std::string& state_dir,
                                              const std::string& db_path, bool start_fresh);

// Writes the marker (idempotent, durable: temp file, fsync, rename). INTERNAL with errno text
// when it cannot.
absl::Status MarkStateDirHeldJobs(const std::string& state_dir);

}  // namespace loom::store
