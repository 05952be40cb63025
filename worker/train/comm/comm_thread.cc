#include "worker/train/comm/comm_thread.h"

#include <exception>

namespace loom::train {

CommThread::CommThread(bool abort_on_failure)
    : abort_on_failure_(abort_on_failure), thread_([this] { Loop(); }) {}

CommThread::~CommThread() {
  std::deque<Item> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    left.swap(queue_);
    cv_.notify_all();
  }
  for (Item& item : left) item.work->Fail(item.what + ": communicator destroyed");
  thread_.join();
}

WorkHandle CommThread::Enqueue(std::string what, std::function<void()> run) {
  auto work = std::make_shared<Work>();
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_.empty() || stop_) {
    work->Fail(what + ": aborted: " + aborted_);
    return work;
  }
  queue_.push_back(Item{std::move(what), std::move(run), work});
  cv_.notify_all();
  return work;
}

void CommThread::Abort(const std::string& why) {
  std::deque<Item> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_.empty()) return;
    aborted_ = why.empty() ? "Abort()" : why;
    left.swap(queue_);
    if (running_) running_->Fail("aborted: " + aborted_);
    if (interrupt_) interrupt_();
  }
  for (Item& item : left) item.work->Fail(item.what + ": aborted: " + why);
}

void CommThread::SetInterrupt(std::function<void()> interrupt) {
  std::lock_guard<std::mutex> lock(mu_);
  interrupt_ = std::move(interrupt);
  // An Abort that came before the operation registered its interrupt still has to reach it.
  if (!aborted_.empty() && interrupt_) interrupt_();
}

bool CommThread::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !aborted_.empty();
}

void CommThread::Loop() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      item = std::move(queue_.front());
      queue_.pop_front();
      running_ = item.work;
    }
    std::string error;
    try {
      item.run();
    } catch (const std::exception& e) {
      error = item.what + ": " + e.what();
    } catch (...) {
      error = item.what + ": unknown exception";
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_.reset();
      interrupt_ = nullptr;
      if (!aborted_.empty() && error.empty()) error = item.what + ": aborted: " + aborted_;
    }
    if (error.empty()) {
      item.work->Complete();
    } else {
      item.work->Fail(error);
      if (abort_on_failure_) Abort(error);  // idempotent: an earlier Abort keeps its reason
    }
  }
}

}  // namespace loom::train
