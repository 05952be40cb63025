#include "server/rpc/stream_logs_reactor.h"

#include <chrono>
#include <utility>

#include "common/grpc_status.h"
#include "server/rpc/job_service.h"

namespace loom::rpc {

StreamLogsReactor::StreamLogsReactor(Params params)
    : params_(std::move(params)),
      link_(std::make_shared<Link>()),
      waker_(std::make_shared<Waker>()) {
  final_pass_ = !params_.follow || params_.finished;
}

StreamLogsReactor* StreamLogsReactor::Start(Params params) {
  auto* reactor = new StreamLogsReactor(std::move(params));
  {
    absl::MutexLock lock(&reactor->link_->mu);
    reactor->link_->reactor = reactor;
  }
  if (!reactor->final_pass_) {
    // A grown log cuts the wait short: the early-cancelled timer calls Wake() on gRPC's thread.
    reactor->listener_ =
        reactor->params_.logs->AddListener(reactor->params_.id, [waker = reactor->waker_] {
          absl::MutexLock lock(&waker->mu);
          waker->grew = true;
          if (waker->timer != nullptr) waker->timer->Cancel();  // no-op once it fired
        });
  }
  reactor->Pump();
  return reactor;
}

void StreamLogsReactor::ArmTimerLocked(absl::Duration delay) {
  timer_armed_ = true;
  absl::MutexLock lock(&waker_->mu);
  waker_->spent = std::move(waker_->timer);
  waker_->timer = std::make_unique<grpc::Alarm>();
  if (waker_->grew) delay = absl::ZeroDuration();  // Wake() clears it
  waker_->timer->Set(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(delay),
                     [link = link_](bool /*fired*/) {
                       absl::MutexLock lock(&link->mu);
                       if (link->reactor != nullptr) link->reactor->Wake();
                     });
}

void StreamLogsReactor::Wake() {
  bool grew = false;
  {
    absl::MutexLock lock(&waker_->mu);
    grew = waker_->grew;
    waker_->grew = false;
  }
  bool check_end = false;
  {
    absl::MutexLock lock(&mu_);
    timer_armed_ = false;
    check_end = !final_pass_ && !stop_;
  }
  if (check_end) {
    absl::StatusOr<bool> done = params_.manager->IsJobFinished(params_.name);
    absl::MutexLock lock(&mu_);
    if (!done.ok()) {
      stop_ = true;
      status_ = ToGrpcStatus(done.status());
    } else {
      final_pass_ = *done;
    }
  }
  {
    // Nothing was appended and the job goes on: no need to read the file again.
    absl::MutexLock lock(&mu_);
    quiet_ = !grew && !final_pass_ && !stop_;
  }
  Pump();
}

void StreamLogsReactor::Pump() {
  enum class Action { kNone, kWrite, kFinish } action = Action::kNone;
  grpc::Status finish_status;
  {
    absl::MutexLock lock(&mu_);
    if (writing_ || finished_ || timer_armed_) return;
    while (!stop_ && pending_.empty()) {
      if (quiet_) {
        quiet_ = false;
        ArmTimerLocked(kStreamPoll);
        return;
      }
      absl::StatusOr<jobs::LogBatch> batch = params_.logs->Read(params_.id, offset_, params_.rank);
      if (!batch.ok()) {
        stop_ = true;
        status_ = ToGrpcStatus(batch.status());
        break;
      }
      for (v1::LogLine& line : batch->lines) pending_.push_back(std::move(line));
      const bool advanced = batch->next_offset > offset_;
      offset_ = batch->next_offset;
      if (advanced) continue;  // read until caught up
      if (final_pass_) {
        if (pending_.empty()) stop_ = true;  // every line sent: the end
        break;
      }
      if (pending_.empty()) {
        // Caught up on a live job: wait for more lines (listener) or the next end check.
        ArmTimerLocked(kStreamPoll);
        return;
      }
      break;
    }
    if (!pending_.empty() && !stop_) {
      current_ = std::move(pending_.front());
      pending_.pop_front();
      writing_ = true;
      action = Action::kWrite;
    } else if (stop_) {
      finished_ = true;
      finish_status = status_;
      action = Action::kFinish;
    }
  }
  if (action == Action::kWrite) StartWrite(&current_);
  if (action == Action::kFinish) Finish(finish_status);
}

void StreamLogsReactor::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) stop_ = true;  // the client went away
  }
  Pump();
}

void StreamLogsReactor::OnCancel() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  {
    absl::MutexLock lock(&waker_->mu);
    // A waiting stream ends now (Wake, Pump, Finish).
    if (waker_->timer != nullptr) waker_->timer->Cancel();
  }
  Pump();
}

void StreamLogsReactor::OnDone() {
  if (listener_ != 0) params_.logs->RemoveListener(params_.id, listener_);
  {
    absl::MutexLock lock(&link_->mu);
    link_->reactor = nullptr;
  }
  delete this;
}

}  // namespace loom::rpc
