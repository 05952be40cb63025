// OutboundBuffer: the messages waiting to go up to loomd, kept across disconnections.
//
// The supervisor pushes rank statuses, step reports and log chunks at any time; the session
// client pops them while a stream is open. While loomd is away everything accumulates here and
// is sent, in order, after the next hello. Memory is bounded without ever losing a rank's life:
//   - log chunks are bounded by total bytes and step reports by count; past a bound the oldest of
//     that kind is dropped (and counted);
//   - rank statuses are never dropped: there are at most a few per launched rank.
// A message written just before a stream broke may not have reached loomd, so EXITED statuses
// written on the current stream are remembered (bounded) and RequeueSentExits() puts them first
// again after a reconnect. loomd treats a repeated EXITED status of a rank as a no-op.
//
// Threading: every method is thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "loom/v1/node.pb.h"
#include "worker/agent/rank_event_sink.h"

namespace loom::worker {

struct OutboundLimits {
  size_t max_log_bytes = 16 << 20;
  size_t max_step_reports = 10000;
  size_t max_resend_exits = 4096;
};

class OutboundBuffer final : public RankEventSink {
 public:
  explicit OutboundBuffer(OutboundLimits limits = {});

  void OnRankStatus(const loom::v1::RankStatus& status) override;
  // Queues them all under one lock, with one wake-up of the writer.
  void OnRankStatuses(std::vector<loom::v1::RankStatus> statuses) override;
  void OnStepReport(const loom::v1::StepReport& report) override;
  void OnLogChunk(const loom::v1::LogChunk& chunk) override;
  void OnStackDump(const loom::v1::StackDump& dump) override;

  // Appends any message (rank_status, step or logs; others are queued with the statuses).
  void Push(loom::v1::WorkerMessage message);

  // Returns the oldest message, waiting until one arrives, `deadline` passes or `cancel` is set
  // (then followed by Wake()). The message counts as in flight until MarkSent() or Unpop().
  // When `more` is given, it says whether another message was already queued behind this one
  // (the writer then lets gRPC hold this one back and send both in one write).
  // With `max_batch` > 1, an oldest message that is a rank status comes out together with the
  // rank statuses queued right behind it (no other kind between them, at most `max_batch` in
  // all and kMaxRankStatusBatchBytes of them) as one `rank_statuses` message; a lone status
  // still comes out as `rank_status`.
  std::optional<loom::v1::WorkerMessage> Pop(absl::Time deadline,
                                             const std::atomic<bool>* cancel = nullptr,
                                             bool* more = nullptr, int max_batch = 1);
  // The popped message was written to the stream.
  void MarkSent(const loom::v1::WorkerMessage& message);
  // The popped message could not be written: it goes back to the front (a batch as the single
  // statuses it was made of, so that a later stream may send them either way).
  void Unpop(loom::v1::WorkerMessage message);
  // Puts the EXITED statuses written since the last call back at the front (after a reconnect).
  void RequeueSentExits();
  // Wakes every Pop() and WaitDrained() so they re-check their cancel flag.
  void Wake();
  // Waits until nothing is queued or in flight, or `deadline`. Returns true when drained.
  bool WaitDrained(absl::Time deadline);

  size_t size() const;
  int64_t dropped_logs() const;
  int64_t dropped_steps() const;

 private:
  struct Entry {
    int64_t seq;
    loom::v1::WorkerMessage message;
  };
  void PushLocked(loom::v1::WorkerMessage message, bool front);

  const OutboundLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // One queue per kind, merged by sequence number on Pop so the overall order is preserved.
  std::deque<Entry> statuses_, steps_, logs_;
  size_t log_bytes_ = 0;
  int64_t next_seq_ = 1;   // for the back
  int64_t front_seq_ = 0;  // for the front: decreasing
  int in_flight_ = 0;
  int64_t dropped_logs_ = 0, dropped_steps_ = 0;
  std::deque<loom::v1::RankStatus> sent_exits_;
};

}  // namespace loom::worker
