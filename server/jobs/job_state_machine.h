// The job state machine. A job's state changes ONLY through Transition(), which checks the
// transition table, updates every field that goes with a state change, and returns the event
// to append to the job's log; so an illegal transition cannot be written, only refused.
//
//   (new) JOB_STATE_UNSPECIFIED ──▶ QUEUED ──▶ SCHEDULED ──▶ RUNNING ──▶ SUCCEEDED
//                                               ▲   │            │
//                                               │   ▼            ▼
//                                            RESTARTING ◀────────┘      (retryable failure)
//   any non-terminal state ──▶ FAILED | CANCELLED;  SUCCEEDED, FAILED, CANCELLED: no way out.
//
// Stateless functions; thread-compatible (the caller owns the Job it passes).
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "loom/v1/job.pb.h"

namespace loom::jobs {

// SUCCEEDED, FAILED and CANCELLED.
bool IsTerminal(v1::JobState state);

// Whether the table allows `from` → `to`. A state never moves to itself.
bool IsTransitionAllowed(v1::JobState from, v1::JobState to);

// Moves `job` to `to` and returns the event to append (the store assigns its sequence).
// On success it sets state, state_reason = reason, update_time = now, and:
//  - entering QUEUED from JOB_STATE_UNSPECIFIED (creation): create_time = now if unset;
//  - entering SCHEDULED: generation += 1 (each (re)launch of the gang gets a new generation,
//    which fences workers still running an older one);
//  - entering RUNNING: start_time = now the first time only (restarts keep the first start);
//  - entering RESTARTING: restart_count += 1, unless `charge` is RestartCharge::kFree (a gang
//    moved off a draining node or re-placed after a start timeout: not the job's fault, so it
//    neither spends nor needs a restart);
//  - entering a terminal state: end_time = now.
// The event carries from_state, to_state, reason, time = now and the job's generation after
// the change. Placements and progress are the caller's business.
// Errors (the job is left untouched):
//  - FAILED_PRECONDITION when the table forbids it, e.g.
//    "job jobs/x is SUCCEEDED; cannot move to RUNNING";
//  - FAILED_PRECONDITION entering RESTARTING (charged) when restart_count already equals
//    spec.restart.max_restarts (the caller must move to FAILED instead: see
//    StateAfterRetryableFailure);
//  - INVALID_ARGUMENT when `reason` is empty (every transition in the log has a reason).
enum class RestartCharge { kCharged, kFree };
absl::StatusOr<v1::JobEvent> Transition(v1::Job& job, v1::JobState to, std::string_view reason,
                                        absl::Time now,
                                        RestartCharge charge = RestartCharge::kCharged);

// What a retryable failure (crash, signal, hung or lost rank) of a non-terminal job leads to:
// RESTARTING while restart_count < spec.restart.max_restarts, else FAILED.
v1::JobState StateAfterRetryableFailure(const v1::Job& job);

// How long a job in RESTARTING waits before it may be scheduled again:
// spec.restart.backoff_seconds × 2^(restart_count − 1), capped at one hour; zero when
// restart_count is 0 or the backoff is not positive.
absl::Duration RestartBackoff(const v1::Job& job);

}  // namespace loom::jobs
