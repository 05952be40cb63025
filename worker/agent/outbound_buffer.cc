#include "worker/agent/outbound_buffer.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "absl/time/clock.h"
#include "common/rank_status_batch.h"

namespace loom::worker {

OutboundBuffer::OutboundBuffer(OutboundLimits limits) : limits_(limits) {}

void OutboundBuffer::OnRankStatus(const loom::v1::RankStatus& status) {
  loom::v1::WorkerMessage m;
  *m.mutable_rank_status() = status;
  Push(std::move(m));
}

void OutboundBuffer::OnRankStatuses(std::vector<loom::v1::RankStatus> statuses) {
  if (statuses.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (loom::v1::RankStatus& status : statuses) {
      loom::v1::WorkerMessage m;
      *m.mutable_rank_status() = std::move(status);
      PushLocked(std::move(m), /*front=*/false);
    }
  }
  cv_.notify_all();
}

void OutboundBuffer::OnStepReport(const loom::v1::StepReport& report) {
  loom::v1::WorkerMessage m;
  *m.mutable_step() = report;
  Push(std::move(m));
}

void OutboundBuffer::OnLogChunk(const loom::v1::LogChunk& chunk) {
  loom::v1::WorkerMessage m;
  *m.mutable_logs() = chunk;
  Push(std::move(m));
}

void OutboundBuffer::OnStackDump(const loom::v1::StackDump& dump) {
  loom::v1::WorkerMessage m;
  *m.mutable_stack_dump() = dump;
  Push(std::move(m));  // queued with the statuses: never dropped
}

void OutboundBuffer::Push(loom::v1::WorkerMessage message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    PushLocked(std::move(message), /*front=*/false);
  }
  cv_.notify_all();
}

void OutboundBuffer::PushLocked(loom::v1::WorkerMessage message, bool front) {
  const int64_t seq = front ? front_seq_-- : next_seq_++;
  std::deque<Entry>* queue = &statuses_;
  if (message.has_step()) queue = &steps_;
  if (message.has_logs()) {
    queue = &logs_;
    log_bytes_ += message.ByteSizeLong();
  }
  Entry entry{seq, std::move(message)};
  if (front) {
    queue->push_front(std::move(entry));
  } else {
    queue->push_back(std::move(entry));
  }
  while (steps_.size() > limits_.max_step_reports) {
    steps_.pop_front();
    ++dropped_steps_;
  }
  while (log_bytes_ > limits_.max_log_bytes && !logs_.empty()) {
    log_bytes_ -= logs_.front().message.ByteSizeLong();
    logs_.pop_front();
    ++dropped_logs_;
  }
}

std::optional<loom::v1::WorkerMessage> OutboundBuffer::Pop(absl::Time deadline,
                                                           const std::atomic<bool>* cancel,
                                                           bool* more, int max_batch) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    std::deque<Entry>* best = nullptr;
    for (std::deque<Entry>* q : {&statuses_, &steps_, &logs_}) {
      if (!q->empty() && (best == nullptr || q->front().seq < best->front().seq)) best = q;
    }
    if (best != nullptr) {
      loom::v1::WorkerMessage m = std::move(best->front().message);
      best->pop_front();
      if (best == &logs_) log_bytes_ -= m.ByteSizeLong();
      ++in_flight_;
      if (m.has_rank_status() && max_batch > 1) {
        // The statuses queue also holds stack dumps; a step or log chunk queued in between (a
        // smaller sequence number) ends the run, so the overall order is kept.
        int64_t limit = std::numeric_limits<int64_t>::max();
        if (!steps_.empty()) limit = std::min(limit, steps_.front().seq);
        if (!logs_.empty()) limit = std::min(limit, logs_.front().seq);
        loom::v1::WorkerMessage batch;
        loom::v1::RankStatusBatch* statuses = batch.mutable_rank_statuses();
        int taken = 1;  // m's
        size_t bytes = m.rank_status().ByteSizeLong();
        while (taken < max_batch && !statuses_.empty() && statuses_.front().seq < limit &&
               statuses_.front().message.has_rank_status()) {
          const size_t next = statuses_.front().message.rank_status().ByteSizeLong();
          if (bytes + next > kMaxRankStatusBatchBytes) break;
          bytes += next;
          if (taken == 1) *statuses->add_statuses() = std::move(*m.mutable_rank_status());
          *statuses->add_statuses() = std::move(*statuses_.front().message.mutable_rank_status());
          statuses_.pop_front();
          ++in_flight_;
          ++taken;
        }
        if (taken > 1) m = std::move(batch);
      }
      if (more != nullptr) *more = !statuses_.empty() || !steps_.empty() || !logs_.empty();
      return m;
    }
    if (cancel != nullptr && cancel->load()) return std::nullopt;
    const absl::Time now = absl::Now();
    if (now >= deadline) return std::nullopt;
    cv_.wait_for(lock, absl::ToChronoNanoseconds(std::min(deadline - now, absl::Seconds(1))));
  }
}

void OutboundBuffer::MarkSent(const loom::v1::WorkerMessage& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto remember = [this](const loom::v1::RankStatus& status) {
      if (status.phase() != loom::v1::RANK_PHASE_EXITED) return;
      sent_exits_.push_back(status);
      while (sent_exits_.size() > limits_.max_resend_exits) sent_exits_.pop_front();
    };
    if (message.has_rank_statuses()) {
      in_flight_ -= message.rank_statuses().statuses_size();
      for (const loom::v1::RankStatus& status : message.rank_statuses().statuses()) {
        remember(status);
      }
    } else {
      --in_flight_;
      if (message.has_rank_status()) remember(message.rank_status());
    }
  }
  cv_.notify_all();
}

void OutboundBuffer::Unpop(loom::v1::WorkerMessage message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (message.has_rank_statuses()) {
      auto* statuses = message.mutable_rank_statuses()->mutable_statuses();
      in_flight_ -= statuses->size();
      // Last first onto the front, so they come out in their order.
      for (int i = statuses->size() - 1; i >= 0; --i) {
        loom::v1::WorkerMessage single;
        *single.mutable_rank_status() = std::move(*statuses->Mutable(i));
        PushLocked(std::move(single), /*front=*/true);
      }
    } else {
      --in_flight_;
      PushLocked(std::move(message), /*front=*/true);
    }
  }
  cv_.notify_all();
}

void OutboundBuffer::RequeueSentExits() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Newest first onto the front, so they come out oldest first.
    while (!sent_exits_.empty()) {
      loom::v1::WorkerMessage m;
      *m.mutable_rank_status() = std::move(sent_exits_.back());
      sent_exits_.pop_back();
      PushLocked(std::move(m), /*front=*/true);
    }
  }
  cv_.notify_all();
}

void OutboundBuffer::Wake() {
  { std::lock_guard<std::mutex> lock(mu_); }
  cv_.notify_all();
}

bool OutboundBuffer::WaitDrained(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (statuses_.empty() && steps_.empty() && logs_.empty() && in_flight_ == 0) return true;
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    cv_.wait_for(lock, absl::ToChronoNanoseconds(std::min(deadline - now, absl::Seconds(1))));
  }
}

size_t OutboundBuffer::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return statuses_.size() + steps_.size() + logs_.size();
}

int64_t OutboundBuffer::dropped_logs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_logs_;
}

int64_t OutboundBuffer::dropped_steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_steps_;
}

}  // namespace loom::worker
