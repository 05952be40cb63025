// Human-readable (`-o table`) renderings of jobs, nodes, progress and log lines. Pure functions
// of their inputs (the current time is a parameter) so that tests pin the exact text.
#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"

namespace loom::client {

// "RUNNING", "SUCCEEDED", ... ("UNKNOWN" for unspecified).
std::string JobStateName(loom::v1::JobState state);
// "READY", "LOST", "UNKNOWN".
std::string NodeStateName(loom::v1::NodeState state);

// Whether the state is SUCCEEDED, FAILED or CANCELLED.
bool IsTerminal(loom::v1::JobState state);

// Compact durations: "45s", "3m05s", "2h07m", "3d04h"; negative durations print as "0s".
std::string FormatShortDuration(absl::Duration d);

// The live line of `watch`:
//   "jobs/abc RUNNING  step 12/200 (6%)  loss 3.9100  5.1k tok/s  ETA 1m23s"
// Fields without data yet are left out (no "loss" before the first step).
std::string FormatProgressLine(const loom::v1::Job& job);

// The final line for a job in a terminal state, e.g.
//   "jobs/abc FAILED after 2 restarts: rank 1 killed by signal 11 (SIGSEGV)".
std::string FormatOutcomeLine(const loom::v1::Job& job);

// `get`: a key/value block with state, reason, layout, progress, placements and events.
std::string FormatJobDetails(const loom::v1::Job& job, absl::Time now);

// "62% (productive 31.0 s of 50.0 s; queued 3.0 s, starting 4.2 s, checkpointing 1.1 s,
// restarts 8.0 s (12 steps trained again), other 2.7 s)": the non-zero buckets only.
std::string FormatGoodput(const loom::v1::Goodput& g);

// `list`: one row per job under a header (NAME STATE PROGRESS LOSS DEVICES AGE).
std::string FormatJobTable(const std::vector<loom::v1::Job>& jobs, absl::Time now);

// `nodes`: one row per node (NAME STATE DEVICES ALLOCATED ADDRESS HEARTBEAT).
std::string FormatNodeTable(const std::vector<loom::v1::Node>& nodes, absl::Time now);

// `logs`: "[gen 1 rank 0] text", with " stderr" after the rank for standard error.
std::string FormatLogLine(const loom::v1::LogLine& line);

// Left-aligned columns two spaces apart, one line per row (the first row is the header).
std::string FormatColumns(const std::vector<std::vector<std::string>>& rows);

}  // namespace loom::client
