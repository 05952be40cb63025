// Clock: injected into every manager that measures time (heartbeat timeouts, restart backoff,
// scheduling latency), so that tests drive time by hand instead of sleeping.
#pragma once

#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace loom {

class Clock {
 public:
  virtual ~Clock() = default;
  // Current wall time. Thread-safe.
  virtual absl::Time Now() const = 0;
};

// The real clock.
class SystemClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

// A clock that moves only when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}
  absl::Time Now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += d;
  }

 private:
  mutable std::mutex mu_;
  absl::Time now_;
};

}  // namespace loom
