#include "worker/agent/trace_responder.h"

#include <algorithm>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "worker/agent/assignment_validator.h"
#include "worker/train/profiler/trace_ring.h"

namespace loom::worker {
namespace {

using loom::train::TraceReadResult;
using loom::train::TraceRecord;
using loom::v1::TraceChunk;
using loom::v1::TraceEvent;
using loom::v1::WorkerMessage;

WorkerMessage NewChunk(const loom::v1::TraceRequest& request, int rank) {
  WorkerMessage m;
  TraceChunk* c = m.mutable_trace_chunk();
  c->set_request_id(request.request_id());
  c->set_job(request.job());
  c->set_generation(request.generation());
  c->set_rank(rank);
  return m;
}

// One record as the wire's event; the kind was checked by the reader (1..TraceKind::kMax,
// the same numbers as TraceEventKind).
TraceEvent ToEvent(const TraceRecord& r) {
  TraceEvent e;
  e.set_kind(static_cast<loom::v1::TraceEventKind>(r.kind));
  e.set_start_unix_nanos(r.start_ns);
  e.set_duration_nanos(r.dur_ns);
  e.set_step(r.step);
  e.set_micro_batch(r.micro);
  e.set_bytes(static_cast<int64_t>(std::min<uint64_t>(r.bytes, uint64_t{1} << 62)));
  e.set_aux(r.aux);
  return e;
}

// Appends the rank's events in range as chunks to `out`; notes go to `notes`.
void AnswerRank(const loom::v1::TraceRequest& request, int rank, const std::string& job_dir,
                const TraceResponderOptions& options, std::vector<WorkerMessage>* out,
                std::vector<std::string>* notes) {
  const std::string prefix = absl::StrCat("rank ", rank, ": ");
  TraceReadResult ring =
      loom::train::ReadTraceFile(TraceFilePath(job_dir, rank), options.max_file_bytes);
  for (const std::string& n : ring.notes) notes->push_back(prefix + n);
  if (!ring.ok) return;
  if (ring.rank != rank || ring.generation != request.generation()) {
    notes->push_back(absl::StrCat(prefix, "the trace file is rank ", ring.rank, "'s of generation ",
                                  ring.generation, " (asked: generation ", request.generation(),
                                  "); skipped"));
    return;
  }
  if (!ring.records.empty() && ring.written > ring.records.size()) {
    int64_t oldest = ring.records.front().step;
    for (const TraceRecord& r : ring.records) oldest = std::min(oldest, r.step);
    // The oldest step kept may have lost its first records to the wrap as well.
    if (oldest >= request.first_step()) {
      notes->push_back(absl::StrCat(prefix, "step ", oldest,
                                    " and earlier were overwritten or are partial (the ring keeps "
                                    "the newest records)"));
    }
  }
  WorkerMessage chunk = NewChunk(request, rank);
  size_t bytes = 0;
  int64_t kept = 0;
  for (const TraceRecord& r : ring.records) {
    if (r.step < request.first_step() || r.step > request.last_step()) continue;
    TraceEvent e = ToEvent(r);
    const size_t size = e.ByteSizeLong() + 2;  // + tag and length
    if (bytes + size > options.max_chunk_bytes && chunk.trace_chunk().events_size() > 0) {
      out->push_back(std::move(chunk));
      chunk = NewChunk(request, rank);
      bytes = 0;
    }
    *chunk.mutable_trace_chunk()->add_events() = std::move(e);
    bytes += size;
    ++kept;
  }
  out->push_back(std::move(chunk));  // possibly empty: the rank answered
  if (kept == 0) {
    notes->push_back(absl::StrCat(prefix, "no events in steps ", request.first_step(), "..",
                                  request.last_step()));
  }
}

}  // namespace

std::string TraceFilePath(const std::string& job_work_dir, int rank) {
  return absl::StrCat(job_work_dir, "/trace-rank-", rank, ".ring");
}

std::vector<WorkerMessage> TraceResponder::Answer(const loom::v1::TraceRequest& request,
                                                  const TraceResponderOptions& options) {
  std::vector<WorkerMessage> out;
  std::vector<std::string> notes;
  absl::StatusOr<std::string> id = JobIdFromName(request.job());
  if (!id.ok()) {
    notes.push_back(absl::StrCat("bad job name in the trace request: ", id.status().message()));
  } else {
    const std::string job_dir = absl::StrCat(options.work_dir, "/jobs/", *id);
    for (int rank : request.ranks()) {
      if (rank < 0) continue;
      AnswerRank(request, rank, job_dir, options, &out, &notes);
    }
  }
  WorkerMessage last = NewChunk(request, -1);
  last.mutable_trace_chunk()->set_last(true);
  for (std::string& n : notes) last.mutable_trace_chunk()->add_notes(std::move(n));
  out.push_back(std::move(last));
  return out;
}

TraceResponder::TraceResponder(TraceResponderOptions options, Send send)
    : options_(std::move(options)), send_(std::move(send)) {
  thread_ = std::thread([this] { Loop(); });
}

TraceResponder::~TraceResponder() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    pending_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

void TraceResponder::Request(loom::v1::TraceRequest request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    if (pending_.size() < options_.max_pending) {
      pending_.push_back(std::move(request));
      cv_.notify_all();
      return;
    }
  }
  // Too many at once: answered without reading, so loomd does not wait for this node.
  WorkerMessage last = NewChunk(request, -1);
  last.mutable_trace_chunk()->set_last(true);
  last.mutable_trace_chunk()->add_notes(absl::StrCat(
      "the worker is busy answering ", options_.max_pending, " other trace requests; try again"));
  send_(std::move(last));
}

void TraceResponder::Loop() {
  for (;;) {
    loom::v1::TraceRequest request;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !pending_.empty(); });
      if (stop_) return;
      request = std::move(pending_.front());
      pending_.pop_front();
    }
    for (WorkerMessage& m : Answer(request, options_)) send_(std::move(m));
  }
}

}  // namespace loom::worker
