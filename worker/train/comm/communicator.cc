#include "worker/train/comm/communicator.h"

#include <algorithm>

#include "worker/train/error.h"

namespace loom::train {

void Work::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
  if (!error_.empty()) throw CommError(error_);
}

bool Work::Done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Work::Complete() {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_) return;
  done_ = true;
  cv_.notify_all();
}

void Work::Fail(const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_) return;
  done_ = true;
  error_ = message.empty() ? "communication failed" : message;
  cv_.notify_all();
}

WorkHandle CompletedWork() {
  auto w = std::make_shared<Work>();
  w->Complete();
  return w;
}

WorkHandle SingleRankCommunicator::Result() {
  std::lock_guard<std::mutex> lock(mu_);
  auto w = std::make_shared<Work>();
  if (aborted_.empty()) {
    w->Complete();
  } else {
    w->Fail("aborted: " + aborted_);
  }
  return w;
}

WorkHandle SingleRankCommunicator::AllReduceSum(float* data, size_t n) { return Result(); }

WorkHandle SingleRankCommunicator::ReduceScatterSum(const float* in, float* out, size_t n) {
  if (in != out) std::copy(in, in + n, out);
  return Result();
}

WorkHandle SingleRankCommunicator::AllGather(const float* in, float* out, size_t n) {
  if (in != out) std::copy(in, in + n, out);
  return Result();
}

WorkHandle SingleRankCommunicator::Broadcast(float* data, size_t n, int root) {
  LOOM_CHECK(root == 0, "broadcast root out of range for a group of one");
  return Result();
}

WorkHandle SingleRankCommunicator::Send(const float* data, size_t n, int dst, uint32_t tag) {
  LOOM_CHECK(false, "Send in a group of one: there is no peer");
  return nullptr;
}

WorkHandle SingleRankCommunicator::Recv(float* data, size_t n, int src, uint32_t tag) {
  LOOM_CHECK(false, "Recv in a group of one: there is no peer");
  return nullptr;
}

WorkHandle SingleRankCommunicator::Barrier() { return Result(); }

void SingleRankCommunicator::Abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = why.empty() ? "Abort()" : why;
}

}  // namespace loom::train
