#include "server/rpc/stream_limiter.h"

#include "absl/strings/str_cat.h"

namespace loom::rpc {

StreamSlot::~StreamSlot() { limiter_->Release(subject_); }

absl::StatusOr<std::unique_ptr<StreamSlot>> StreamLimiter::Acquire(const std::string& subject) {
  absl::MutexLock lock(&mu_);
  int& open = open_[subject];
  if (open >= max_per_client_) {
    return absl::ResourceExhaustedError(absl::StrCat("\"", subject, "\" already has ", open, " ",
                                                     what_, " (the limit is ", max_per_client_,
                                                     " per client); ", way_out_));
  }
  ++open;
  return std::make_unique<StreamSlot>(this, subject);
}

int StreamLimiter::open(const std::string& subject) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(subject);
  return it == open_.end() ? 0 : it->second;
}

void StreamLimiter::Release(const std::string& subject) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(subject);
  if (it == open_.end()) return;
  if (--it->second <= 0) open_.erase(it);
}

}  // namespace loom::rpc
