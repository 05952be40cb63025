// TraceResponder: the worker's answer to loomd's TraceRequest (`loomctl trace`). For each rank
// named, it reads the rank's trace ring (LOOM_TRACE_FILE = <job work dir>/trace-rank-R.ring,
// worker/train/profiler/trace_ring.h), keeps the records of the request's generation and step
// range, and sends them up as TraceChunk messages of at most `max_chunk_bytes` each, then a last
// chunk (last = true) with the notes: a rank without a file, a ring of another generation,
// torn or implausible records skipped, steps already overwritten.
//
// The ring is written by the user's rank program, so it is parsed defensively (the reader never
// trusts a size or a count and never reads out of bounds; a bad file is a note).
//
// Threading: Request() is thread-safe and returns at once (the session's reader thread calls
// it); one thread of the responder reads the files. At most `max_pending` requests wait; more
// are answered at once with a note.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom/v1/node.pb.h"

namespace loom::worker {

// The rank's ring in its job's work dir (RankPaths::work_dir): LOOM_TRACE_FILE.
std::string TraceFilePath(const std::string& job_work_dir, int rank);

struct TraceResponderOptions {
  std::string work_dir;              // the worker's --work-dir (jobs live in <work_dir>/jobs)
  size_t max_chunk_bytes = 1 << 20;  // events per TraceChunk, encoded
  size_t max_file_bytes = 65 << 20;  // a larger ring file is refused (64 MiB of records)
  size_t max_pending = 4;
};

class TraceResponder {
 public:
  using Send = std::function<void(loom::v1::WorkerMessage)>;
  // `send` is called on the responder's thread (the outbound buffer's Push).
  TraceResponder(TraceResponderOptions options, Send send);
  ~TraceResponder();  // finishes the request being answered, drops the others
  TraceResponder(const TraceResponder&) = delete;
  TraceResponder& operator=(const TraceResponder&) = delete;

  void Request(loom::v1::TraceRequest request);

  // The messages that answer `request` (the pure part, for tests): chunks of events per rank,
  // then the last chunk with the notes.
  static std::vector<loom::v1::WorkerMessage> Answer(const loom::v1::TraceRequest& request,
                                                     const TraceResponderOptions& options);

 private:
  void Loop();

  const TraceResponderOptions options_;
  const Send send_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<loom::v1::TraceRequest> pending_;  // guarded by mu_
  bool stop_ = false;                           // guarded by mu_
  std::thread thread_;
};

}  // namespace loom::worker
