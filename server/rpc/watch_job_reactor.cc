#include "server/rpc/watch_job_reactor.h"

#include <utility>

#include "server/jobs/job_state_machine.h"
#include "server/rpc/call_auth.h"

namespace loom::rpc {

WatchJobReactor::WatchJobReactor(auth::Principal who,
                                 std::shared_ptr<jobs::JobSubscription> subscription,
                                 std::unique_ptr<StreamSlot> slot)
    : who_(std::move(who)),
      subscription_(std::move(subscription)),
      slot_(std::move(slot)),
      link_(std::make_shared<Link>()) {}

WatchJobReactor* WatchJobReactor::Start(auth::Principal who,
                                        std::shared_ptr<jobs::JobSubscription> subscription,
                                        std::unique_ptr<StreamSlot> slot) {
  auto* reactor = new WatchJobReactor(std::move(who), std::move(subscription), std::move(slot));
  {
    absl::MutexLock lock(&reactor->link_->mu);
    reactor->link_->reactor = reactor;
  }
  reactor->subscription_->SetListener([link = reactor->link_] {
    absl::MutexLock lock(&link->mu);
    if (link->reactor != nullptr) link->reactor->Pump();
  });
  // The first update (the job as it is now) is already queued.
  reactor->Pump();
  return reactor;
}

void WatchJobReactor::Pump() {
  enum class Action { kNone, kWrite, kFinish } action = Action::kNone;
  {
    absl::MutexLock lock(&mu_);
    if (writing_ || finished_) return;
    if (!stop_) {
      if (std::optional<v1::Job> job = subscription_->TryNext(); job.has_value()) {
        if (jobs::IsTerminal(job->state())) stop_ = true;  // the last write
        update_.Clear();
        *update_.mutable_job() = std::move(*job);
        RedactForeign(who_, update_.mutable_job());
        writing_ = true;
        action = Action::kWrite;
      } else if (subscription_->closed()) {
        stop_ = true;  // loomd is shutting down
      }
    }
    if (action == Action::kNone && stop_) {
      finished_ = true;
      action = Action::kFinish;
    }
  }
  if (action == Action::kWrite) StartWrite(&update_);
  if (action == Action::kFinish) Finish(grpc::Status::OK);  // OnDone follows, on another thread
}

void WatchJobReactor::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) stop_ = true;  // the client went away
  }
  Pump();
}

void WatchJobReactor::OnCancel() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  Pump();
}

void WatchJobReactor::OnDone() {
  subscription_->SetListener(nullptr);
  {
    // Waits for a listener call in progress; later ones find no reactor.
    absl::MutexLock lock(&link_->mu);
    link_->reactor = nullptr;
  }
  delete this;
}

}  // namespace loom::rpc
