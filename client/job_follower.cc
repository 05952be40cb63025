#include "client/job_follower.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/job_format.h"

namespace loom::client {
namespace {

// Errors after which re-opening the stream may help (loomd restarting, a dropped connection).
bool IsTransient(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;
  }
}

}  // namespace

void ProgressDisplay::Update(const loom::v1::Job& job) {
  const std::string line = FormatProgressLine(job);
  if (line == last_) return;
  last_ = line;
  if (redraw_in_place_) {
    out_ << '\r' << line << "\x1b[K" << std::flush;
    line_open_ = true;
  } else {
    out_ << line << '\n' << std::flush;
  }
}

void ProgressDisplay::Finish() {
  if (line_open_) out_ << '\n' << std::flush;
  line_open_ = false;
}

absl::StatusOr<loom::v1::Job> FollowJob(Connection& connection, const std::string& name,
                                        const std::function<void(const loom::v1::Job&)>& on_update,
                                        const FollowOptions& options) {
  bool had_contact = false;
  absl::Time last_contact = absl::Now();
  absl::Duration backoff = options.retry_initial;
  while (true) {
    loom::v1::WatchJobRequest watch;
    watch.set_name(name);
    std::optional<loom::v1::Job> final_job;
    bool malformed = false;
    absl::Status stream_status = connection.Stream(rpc::kWatchJob, watch, [&](std::string_view m) {
      loom::v1::JobUpdate update;
      if (!ParseStreamMessage(m, &update)) return !(malformed = true);
      had_contact = true;
      last_contact = absl::Now();
      backoff = options.retry_initial;
      on_update(update.job());
      if (IsTerminal(update.job().state())) {
        final_job = update.job();
        return false;  // cancels the stream
      }
      return true;
    });
    if (final_job.has_value()) return *std::move(final_job);
    if (stream_status.ok() && malformed) {
      stream_status = absl::InternalError("loomd sent a job update that does not parse");
    }
    if (!stream_status.ok() && !(had_contact && IsTransient(stream_status))) return stream_status;

    // The stream ended before a terminal state: the job may have ended meanwhile.
    loom::v1::GetJobRequest request;
    request.set_name(name);
    loom::v1::Job job;
    const absl::Status get_status = connection.Call(rpc::kGetJob, request, &job);
    if (get_status.ok()) {
      had_contact = true;
      last_contact = absl::Now();
      on_update(job);
      if (IsTerminal(job.state())) return job;
    } else if (!IsTransient(get_status) || !had_contact) {
      return get_status;
    }
    const absl::Status last_error = get_status.ok() ? stream_status : get_status;
    if (absl::Now() - last_contact > options.reconnect_window) {
      return last_error.ok() ? absl::UnavailableError(absl::StrCat(
                                   "the watch of ", name, " kept ending before the job did"))
                             : last_error;
    }
    absl::SleepFor(backoff);  // retry backoff, not synchronisation
    backoff = std::min(backoff * 2, options.retry_max);
  }
}

}  // namespace loom::client
