// LogStore: the stdout/stderr lines that workers forward for each job, kept on disk so that
// `loomctl logs` works after the job ends and after a loomd restart.
//
// Layout: <dir>/<job-id>/output.log, one line per forwarded line, rank-tagged:
//   <generation> TAB <rank> TAB <stream> TAB <node> TAB <unix micros> TAB <text> LF
// Text is stored with CR/LF/TAB replaced by spaces and cut at kMaxLineBytes. A job's file is
// capped at `max_bytes_per_job`; the first line that would pass the cap is replaced by one
// marker line (rank -1, stream "loom") and later lines are dropped.
//
// Followers (StreamJobLogs with follow) read from a byte offset and block in WaitForMore()
// until the file grows; Append() wakes them.
//
// Threading: thread-safe. Appends to one job are serialised by the store's lock (so lines of
// concurrent chunks never interleave inside a line); reads open the file independently and
// only ever return whole lines.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"

namespace loom::jobs {

inline constexpr int64_t kDefaultMaxLogBytesPerJob = int64_t{64} << 20;
inline constexpr size_t kMaxLineBytes = 16 << 10;

struct LogBatch {
  std::vector<v1::LogLine> lines;  // lines that pass the rank filter
  int64_t next_offset = 0;         // where the next Read() continues
};

class LogStore {
 public:
  // Creates `dir` if needed. INTERNAL naming the directory when it cannot be created.
  static absl::StatusOr<std::unique_ptr<LogStore>> Open(
      const std::string& dir, int64_t max_bytes_per_job = kDefaultMaxLogBytesPerJob);
  LogStore(const LogStore&) = delete;
  LogStore& operator=(const LogStore&) = delete;

  // Appends the chunk's lines for job `job_id` (the {job} of jobs/{job}, already validated by
  // the caller: [a-z0-9-] only) as sent by node `node` ("nodes/{node}") at `now`, and wakes
  // followers. INVALID_ARGUMENT for an id that could escape the directory; INTERNAL on a disk
  // error (nothing is partially written beyond what the OS accepted).
  absl::Status Append(std::string_view job_id, const v1::LogChunk& chunk, std::string_view node,
                      absl::Time now);

  // Reads whole lines from byte `offset` (0 = the start), about `max_bytes` of file at most, and
  // returns those whose rank is `rank` (all when nullopt; marker lines always pass). A job
  // without logs yet reads as empty. INVALID_ARGUMENT for a negative offset.
  absl::StatusOr<LogBatch> Read(std::string_view job_id, int64_t offset, std::optional<int> rank,
                                int64_t max_bytes = 1 << 20);

  // Blocks until the job's log is longer than `offset`, `timeout` passes, or Shutdown().
  // Returns true when there is more to read.
  bool WaitForMore(std::string_view job_id, int64_t offset, absl::Duration timeout);

  // Wakes every follower; later WaitForMore() calls return at once.
  void Shutdown();

  // For followers that hold no thread (StreamJobLogs on the callback API): `listener` is called
  // after each Append() to `job_id` and at Shutdown(), without the store's lock but on the
  // appending thread (which may hold the job manager's lock): it must be quick and must not call
  // into the job manager or this store. Returns the id for RemoveListener(); a call already
  // started may still run after RemoveListener() returns.
  uint64_t AddListener(std::string_view job_id, std::function<void()> listener);
  void RemoveListener(std::string_view job_id, uint64_t id);

 private:
  struct JobLog {
    int64_t size = 0;  // bytes in the file (known once loaded)
    bool loaded = false;
    bool truncated = false;
  };

  LogStore(std::string dir, int64_t max_bytes_per_job);
  // Append() without calling the listeners; adds the ones to call to `wake`.
  absl::Status AppendLocked(std::string_view job_id, const v1::LogChunk& chunk,
                            std::string_view node, absl::Time now,
                            std::vector<std::function<void()>>* wake)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string PathOf(std::string_view job_id) const;
  // The job's bookkeeping, loading the size of an existing file on first use. Requires mu_.
  JobLog& LogOf(std::string_view job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  const int64_t max_bytes_per_job_;
  absl::Mutex mu_;
  absl::CondVar grew_;
  std::map<std::string, JobLog, std::less<>> logs_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_listener_ ABSL_GUARDED_BY(mu_) = 1;
  using Listeners = std::map<uint64_t, std::function<void()>>;
  std::map<std::string, Listeners, std::less<>> listeners_ ABSL_GUARDED_BY(mu_);
};

// True when `id` is a job id that is safe as a file name: 1..63 of [a-z0-9-], not starting
// with '-'.
bool IsSafeJobId(std::string_view id);

}  // namespace loom::jobs
