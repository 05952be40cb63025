// RankEventRecorder: a RankEventSink for tests that keeps every event and lets a test wait for
// a condition over them. Thread-safe.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/agent/rank_event_sink.h"

namespace loom::worker::testing {

class RankEventRecorder : public RankEventSink {
 public:
  struct Events {
    std::vector<v1::RankStatus> statuses;
    std::vector<v1::StepReport> steps;
    std::vector<v1::LogChunk> logs;
    std::vector<v1::StackDump> dumps;

    // The EXITED status of (job, rank), or nullptr.
    const v1::RankStatus* Exit(const std::string& job, int rank) const {
      for (const v1::RankStatus& s : statuses) {
        if (s.job() == job && s.rank() == rank && s.phase() == v1::RANK_PHASE_EXITED) return &s;
      }
      return nullptr;
    }
    int CountExits(const std::string& job) const {
      int n = 0;
      for (const v1::RankStatus& s : statuses) {
        n += s.job() == job && s.phase() == v1::RANK_PHASE_EXITED;
      }
      return n;
    }
    // Every log line of (job, rank, stream), in order.
    std::vector<std::string> Lines(const std::string& job, int rank,
                                   const std::string& stream) const {
      std::vector<std::string> lines;
      for (const v1::LogChunk& c : logs) {
        if (c.job() == job && c.rank() == rank && c.stream() == stream) {
          lines.insert(lines.end(), c.lines().begin(), c.lines().end());
        }
      }
      return lines;
    }
  };

  void OnRankStatus(const v1::RankStatus& s) override {
    Add([&](Events& e) { e.statuses.push_back(s); });
  }
  void OnStepReport(const v1::StepReport& r) override {
    Add([&](Events& e) { e.steps.push_back(r); });
  }
  void OnLogChunk(const v1::LogChunk& c) override {
    Add([&](Events& e) { e.logs.push_back(c); });
  }
  void OnStackDump(const v1::StackDump& d) override {
    Add([&](Events& e) { e.dumps.push_back(d); });
  }

  // Waits until `pred(events)` holds or `timeout` passes; returns whether it holds.
  bool WaitFor(const std::function<bool(const Events&)>& pred,
               absl::Duration timeout = absl::Seconds(20)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return pred(events_); });
  }

  Events Snapshot() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  void Add(const std::function<void(Events&)>& f) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      f(events_);
    }
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  Events events_;
};

}  // namespace loom::worker::testing
