#include "server/jobs/job_state_machine.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/timestamp.pb.h"

namespace loom::jobs {
namespace {

void SetTimestamp(absl::Time time, google::protobuf::Timestamp* out) {
  const absl::Duration since_epoch = time - absl::UnixEpoch();
  const int64_t seconds = absl::ToInt64Seconds(absl::Floor(since_epoch, absl::Seconds(1)));
  out->set_seconds(seconds);
  out->set_nanos(
      static_cast<int32_t>(absl::ToInt64Nanoseconds(since_epoch - absl::Seconds(seconds))));
}

// The longest wait between restarts, however many there were.
constexpr absl::Duration kMaxBackoff = absl::Hours(1);

}  // namespace

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

bool IsTransitionAllowed(v1::JobState from, v1::JobState to) {
  // Every non-terminal state may fail or be cancelled; the rest is the forward path.
  const bool live =
      from == v1::QUEUED || from == v1::SCHEDULED || from == v1::RUNNING || from == v1::RESTARTING;
  if (live && (to == v1::FAILED || to == v1::CANCELLED)) return true;
  switch (from) {
    case v1::JOB_STATE_UNSPECIFIED:  // a job being created
      return to == v1::QUEUED;
    case v1::QUEUED:
      return to == v1::SCHEDULED;
    case v1::SCHEDULED:
      // A rank can die (or its node be lost) before every rank has started.
      return to == v1::RUNNING || to == v1::RESTARTING;
    case v1::RUNNING:
      return to == v1::SUCCEEDED || to == v1::RESTARTING;
    case v1::RESTARTING:
      return to == v1::SCHEDULED;
    default:  // terminal states, and values outside the enum
      return false;
  }
}

absl::StatusOr<v1::JobEvent> Transition(v1::Job& job, v1::JobState to, std::string_view reason,
                                        absl::Time now, RestartCharge charge) {
  const bool charged = charge == RestartCharge::kCharged;
  const v1::JobState from = job.state();
  if (!IsTransitionAllowed(from, to)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job.name(), " is ",
                                                      v1::JobState_Name(from), "; cannot move to ",
                                                      v1::JobState_Name(to)));
  }
  if (reason.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("moving job ", job.name(), " to ", v1::JobState_Name(to),
                     " needs a reason: every event in the log says why"));
  }
  if (to == v1::RESTARTING && charged &&
      job.restart_count() >= job.spec().restart().max_restarts()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job.name(), " has used ", job.restart_count(), " of its ",
                     job.spec().restart().max_restarts(), " restarts; move it to FAILED instead"));
  }

  job.set_state(to);
  job.set_state_reason(std::string(reason));
  SetTimestamp(now, job.mutable_update_time());
  if (from == v1::JOB_STATE_UNSPECIFIED && !job.has_create_time()) {
    SetTimestamp(now, job.mutable_create_time());
  }
  if (to == v1::SCHEDULED) job.set_generation(job.generation() + 1);
  if (to == v1::RUNNING && !job.has_start_time()) SetTimestamp(now, job.mutable_start_time());
  if (to == v1::RESTARTING && charged) job.set_restart_count(job.restart_count() + 1);
  if (IsTerminal(to)) SetTimestamp(now, job.mutable_end_time());

  v1::JobEvent event;
  SetTimestamp(now, event.mutable_time());
  event.set_from_state(from);
  event.set_to_state(to);
  event.set_reason(std::string(reason));
  event.set_generation(job.generation());
  return event;
}

v1::JobState StateAfterRetryableFailure(const v1::Job& job) {
  return job.restart_count() < job.spec().restart().max_restarts() ? v1::RESTARTING : v1::FAILED;
}

absl::Duration RestartBackoff(const v1::Job& job) {
  const double base = job.spec().restart().backoff_seconds();
  if (job.restart_count() <= 0 || !(base > 0) || !std::isfinite(base)) return absl::ZeroDuration();
  // 2^(n-1) overflows nothing: the exponent is clamped well before the cap would be passed.
  const int doublings = std::min(job.restart_count() - 1, 32);
  const double seconds = base * std::ldexp(1.0, doublings);
  return std::min(absl::Seconds(seconds), kMaxBackoff);
}

}  // namespace loom::jobs
