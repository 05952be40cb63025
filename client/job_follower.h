// Following a job to its end: the WatchJob stream, kept alive across loomd restarts, and the
// live progress display shared by `watch` and `submit --wait`.
#pragma once

#include <functional>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/connection.h"
#include "loom/v1/job.pb.h"

namespace loom::client {

// Draws the progress line of a job. On a terminal the line is redrawn in place ("\r", then the
// text, then erase-to-end-of-line); otherwise one line is printed per update whose text differs
// from the previous one, so logs of `watch` stay readable.
class ProgressDisplay {
 public:
  ProgressDisplay(std::ostream& out, bool redraw_in_place)
      : out_(out), redraw_in_place_(redraw_in_place) {}
  ProgressDisplay(const ProgressDisplay&) = delete;
  ProgressDisplay& operator=(const ProgressDisplay&) = delete;

  void Update(const loom::v1::Job& job);
  // Ends an in-place line with a newline, so that what follows starts on a fresh line.
  void Finish();

 private:
  std::ostream& out_;
  const bool redraw_in_place_;
  std::string last_;
  bool line_open_ = false;
};

struct FollowOptions {
  // How long to keep retrying after contact with loomd was lost (e.g. while it restarts).
  // There is no retry before the first contact: an unreachable server fails at once.
  absl::Duration reconnect_window = absl::Seconds(60);
  absl::Duration retry_initial = absl::Milliseconds(200);
  absl::Duration retry_max = absl::Seconds(2);
};

// Streams WatchJob for `name` and calls `on_update` with every snapshot until the job reaches a
// terminal state, which is returned. A stream that breaks (UNAVAILABLE, ...) or ends early is
// re-opened, after a GetJob that catches a job which ended while the stream was down. Errors:
// the server's (NOT_FOUND for an unknown job, ...), or the last connection error once
// `reconnect_window` has passed without contact.
absl::StatusOr<loom::v1::Job> FollowJob(Connection& connection, const std::string& name,
                                        const std::function<void(const loom::v1::Job&)>& on_update,
                                        const FollowOptions& options = {});

}  // namespace loom::client
