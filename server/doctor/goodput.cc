#include "server/doctor/goodput.h"

#include <algorithm>
#include <cmath>

namespace loom::doctor {
namespace {

bool Terminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

double Seconds(absl::Duration d) { return std::max(0.0, absl::ToDoubleSeconds(d)); }

}  // namespace

GoodputLedger::GoodputLedger(absl::Time create_time, const v1::Goodput& persisted,
                             v1::JobState state, absl::Time now)
    : create_time_(create_time), g_(persisted) {
  // Only the closed buckets and step counters carry over; the open segment restarts now.
  g_.clear_wall_seconds();
  g_.clear_ratio();
  g_.clear_other_seconds();
  if (state == v1::RUNNING) {
    // Its first step was seen before loomd restarted; the next report continues it.
    segment_ = Segment::kRunning;
    generation_started_ = true;
    open_since_ = now;
    return;
  }
  EnterState(state, state == v1::RESTARTING ? WaitCause::kRestart : WaitCause::kQueued, now);
}

void GoodputLedger::Close(absl::Time now, v1::Goodput& g) const {
  const double s = Seconds(now - open_since_);
  switch (segment_) {
    case Segment::kWaiting:
      if (cause_ == WaitCause::kQueued) g.set_queued_seconds(g.queued_seconds() + s);
      if (cause_ == WaitCause::kRestart) g.set_restart_seconds(g.restart_seconds() + s);
      if (cause_ == WaitCause::kRebalance) g.set_rebalance_seconds(g.rebalance_seconds() + s);
      break;
    case Segment::kStarting:
      g.set_starting_seconds(g.starting_seconds() + s);
      break;
    case Segment::kNone:
    case Segment::kRunning:  // its steps and checkpoints are counted as they come; rest: other
    case Segment::kDone:
      break;
  }
}

void GoodputLedger::EnterState(v1::JobState state, WaitCause cause, absl::Time now) {
  if (segment_ == Segment::kDone) return;
  Close(now, g_);
  open_since_ = now;
  if (Terminal(state)) {
    segment_ = Segment::kDone;
    end_time_ = now;
    return;
  }
  switch (state) {
    case v1::QUEUED:
      // A job queued again after a restart still waits because of it.
      if (segment_ != Segment::kWaiting) cause_ = cause;
      segment_ = Segment::kWaiting;
      break;
    case v1::RESTARTING:
      cause_ = cause == WaitCause::kQueued ? WaitCause::kRestart : cause;
      segment_ = Segment::kWaiting;
      break;
    case v1::SCHEDULED:
      segment_ = Segment::kStarting;
      generation_started_ = false;
      break;
    case v1::RUNNING:
      // Starting lasts until the generation's first step.
      segment_ = generation_started_ ? Segment::kRunning : Segment::kStarting;
      break;
    default:
      break;
  }
}

void GoodputLedger::Step(int64_t generation, int64_t step, double step_seconds, absl::Time now) {
  if (segment_ == Segment::kDone || generation < generation_) return;
  if (!std::isfinite(step_seconds) || step_seconds < 0) step_seconds = 0;
  if (generation > generation_ || !generation_started_) {
    generation_ = generation;
    generation_started_ = true;
    // The first step ran during [now - step_seconds, now): starting ends where it began.
    if (segment_ == Segment::kStarting) {
      Close(now - absl::Seconds(step_seconds), g_);
      open_since_ = now;
      segment_ = Segment::kRunning;
    }
    // Resumed below the highest step reached: the steps in between are trained again. Their
    // time (at the mean kept step) was productive and is now lost to the interruption.
    const int64_t resumed = std::max<int64_t>(0, step - 1);
    if (g_.reached_step() > resumed && g_.kept_steps() > 0) {
      const int64_t lost = std::min(g_.reached_step() - resumed, g_.kept_steps());
      const double mean = g_.productive_seconds() / static_cast<double>(g_.kept_steps());
      const double lost_seconds = mean * static_cast<double>(lost);
      g_.set_productive_seconds(std::max(0.0, g_.productive_seconds() - lost_seconds));
      g_.set_kept_steps(g_.kept_steps() - lost);
      g_.set_steps_lost(g_.steps_lost() + lost);
      if (cause_ == WaitCause::kRebalance) {
        g_.set_rebalance_seconds(g_.rebalance_seconds() + lost_seconds);
      } else {
        g_.set_restart_seconds(g_.restart_seconds() + lost_seconds);
      }
      g_.set_reached_step(resumed);
    }
  }
  if (step <= g_.reached_step()) return;  // a report sent twice
  g_.set_reached_step(step);
  g_.set_kept_steps(g_.kept_steps() + 1);
  g_.set_productive_seconds(g_.productive_seconds() + step_seconds);
}

void GoodputLedger::Checkpoint(double seconds) {
  if (segment_ == Segment::kDone || !std::isfinite(seconds) || seconds < 0) return;
  g_.set_checkpointing_seconds(g_.checkpointing_seconds() + seconds);
}

v1::Goodput GoodputLedger::Snapshot(absl::Time now) const {
  v1::Goodput g = g_;
  const absl::Time end = segment_ == Segment::kDone ? end_time_ : now;
  Close(end, g);
  const double wall = Seconds(end - create_time_);
  g.set_wall_seconds(wall);
  const double named = g.productive_seconds() + g.queued_seconds() + g.starting_seconds() +
                       g.checkpointing_seconds() + g.restart_seconds() + g.rebalance_seconds();
  g.set_other_seconds(std::max(0.0, wall - named));
  g.set_ratio(wall > 0 ? std::min(1.0, g.productive_seconds() / wall) : 0.0);
  return g;
}

}  // namespace loom::doctor
