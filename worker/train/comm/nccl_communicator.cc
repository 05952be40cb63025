// NcclCommunicator: two non-blocking NCCL communicators (collectives; point-to-point, split from
// the first) on two non-blocking CUDA streams, and a watchdog thread that completes Works from
// their events and aborts everything on a timeout or an asynchronous NCCL error.
//
// Locks, always taken in this order when nested: issue_mu_ (the collective communicator, its
// stream and events, compute_), p2p_mu_ (the point-to-point ones), mu_ (the pending queues, the
// event pool, the abort reason). A Work is completed or failed under mu_ at most (its own mutex
// is a leaf).
#include "worker/train/comm/nccl_communicator.h"

#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/train/error.h"

namespace loom::train {
namespace {

using Clock = std::chrono::steady_clock;

// How often the watchdog looks at running operations: short against a collective's duration,
// long enough that an idle poll costs nothing measurable.
constexpr std::chrono::microseconds kPollInterval{50};

[[noreturn]] void ThrowAt(const char* file, int line, const std::string& what) {
  throw CommError(std::string(file) + ":" + std::to_string(line) + ": " + what);
}

void CheckCuda(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return;
  ThrowAt(file, line,
          std::string(call) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

std::string NcclMessage(ncclResult_t r, ncclComm_t comm) {
  std::string m = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') m += " (" + std::string(last) + ")";
  return m;
}

// "5 s", "0.3 s".
std::string Seconds(std::chrono::milliseconds t) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", static_cast<double>(t.count()) / 1000.0);
  return text;
}

// Waits until a call on a non-blocking communicator has finished (the call returned
// ncclInProgress), then throws CommError unless it succeeded. Gives up, throwing, at `deadline`
// or once `aborted` is set, so that a caller holding a lock never holds it indefinitely.
void SettleNccl(ncclComm_t comm, ncclResult_t r, const char* call, const char* file, int line,
                Clock::time_point deadline, const std::atomic<bool>* aborted) {
  while (r == ncclInProgress) {
    if (aborted != nullptr && aborted->load()) ThrowAt(file, line, std::string(call) + ": aborted");
    if (Clock::now() > deadline) ThrowAt(file, line, std::string(call) + ": timed out");
    std::this_thread::sleep_for(std::chrono::microseconds(10));
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    r = q != ncclSuccess ? q : state;
  }
  if (r != ncclSuccess) ThrowAt(file, line, std::string(call) + ": " + NcclMessage(r, comm));
}

#define LOOM_COMM_CUDA(call) CheckCuda((call), #call, __FILE__, __LINE__)

ncclDataType_t NcclType(DeviceDType t) {
  return t == DeviceDType::kBFloat16 ? ncclBfloat16 : ncclFloat32;
}

// Makes `device` current on this thread for a scope, restoring the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    LOOM_COMM_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device) LOOM_COMM_CUDA(cudaSetDevice(device));
    changed_ = previous_ != device;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

class NcclComm final : public NcclCommunicator {
 public:
  explicit NcclComm(const NcclOptions& o)
      : rank_(o.rank),
        size_(o.size),
        device_(o.device),
        timeout_(o.timeout),
        label_("rank " + std::to_string(o.rank) + " of " + std::to_string(o.size) + " (group " +
               o.group + ", cuda:" + std::to_string(o.device) + ")"),
        compute_(o.compute_stream) {}

  // Creates the streams, events and communicators; the caller's current device is kept.
  void Init(const ncclUniqueId& id, const std::string& where) {
    DeviceGuard guard(device_);
    LOOM_COMM_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    LOOM_COMM_CUDA(cudaStreamCreateWithFlags(&p2p_stream_, cudaStreamNonBlocking));
    LOOM_COMM_CUDA(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    LOOM_COMM_CUDA(cudaEventCreateWithFlags(&p2p_ready_, cudaEventDisableTiming));
    LOOM_COMM_CUDA(cudaEventCreateWithFlags(&all_done_, cudaEventDisableTiming));
    LOOM_COMM_CUDA(cudaEventCreateWithFlags(&p2p_all_done_, cudaEventDisableTiming));
    LOOM_COMM_CUDA(cudaMalloc(reinterpret_cast<void**>(&scratch_), sizeof(float)));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // no NCCL call may hang the host on a dead peer
    const Clock::time_point deadline = Clock::now() + timeout_;
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
    try {
      SettleNccl(comm, r, "ncclCommInitRankConfig", __FILE__, __LINE__, deadline, nullptr);
    } catch (const CommError& e) {
      if (comm != nullptr) ncclCommAbort(comm);
      if (Clock::now() > deadline) {
        throw CommError(label_ + ": NCCL initialisation of " + std::to_string(size_) +
                        " ranks timed out after " + Seconds(timeout_) + " in " + where +
                        ": not every rank joined");
      }
      throw CommError(label_ + ": NCCL initialisation through " + where + " failed: " + e.what());
    }
    comm_ = comm;
    if (size_ > 1) {
      // Point-to-point gets a communicator of its own, so a Recv never waits behind a
      // collective on the device.
      ncclComm_t p2p = nullptr;
      const ncclResult_t s = ncclCommSplit(comm_, 0, rank_, &p2p, &config);
      try {
        SettleNccl(comm_, s, "ncclCommSplit", __FILE__, __LINE__, deadline, nullptr);
        if (p2p != nullptr) {
          SettleNccl(p2p, ncclInProgress, "ncclCommSplit (new communicator)", __FILE__, __LINE__,
                     deadline, nullptr);
        }
      } catch (const CommError& e) {
        if (p2p != nullptr) ncclCommAbort(p2p);
        ncclCommAbort(comm_);  // finalising it would wait for peers that may be gone
        comm_ = nullptr;
        throw CommError(label_ + ": " + e.what());
      }
      p2p_ = p2p;
    }
    watchdog_ = std::thread([this] { Watch(); });
  }

  // A normal end lets issued operations finish (within the timeout) and finalises the
  // communicators; otherwise, or when that fails, they are aborted. Never throws.
  ~NcclComm() override {
    const Clock::time_point deadline = Clock::now() + timeout_;
    if (watchdog_.joinable()) {
      for (;;) {
        std::unique_lock<std::mutex> lock(mu_);
        if (coll_pending_.empty() && p2p_pending_.empty()) break;
        lock.unlock();
        if (Clock::now() > deadline) {
          AbortWith("communicator destroyed with operations still running");
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      watchdog_.join();
    }
    DeviceGuardNoThrow guard(device_);
    for (ncclComm_t* c : {&p2p_, &comm_}) {
      if (*c == nullptr) continue;
      try {
        SettleNccl(*c, ncclCommFinalize(*c), "ncclCommFinalize", __FILE__, __LINE__, deadline,
                   nullptr);
        ncclCommDestroy(*c);
      } catch (const CommError&) {
        ncclCommAbort(*c);
      }
      *c = nullptr;
    }
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    for (cudaEvent_t e : abandoned_events_) cudaEventDestroy(e);
    for (cudaEvent_t e : {ready_, p2p_ready_, all_done_, p2p_all_done_}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (p2p_stream_ != nullptr) cudaStreamDestroy(p2p_stream_);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }
  cudaStream_t stream() const override { return stream_; }

  WorkHandle AllReduceSum(float* data, size_t n) override {
    return AllReduceSum(data, n, DeviceDType::kFloat32);
  }
  WorkHandle AllReduceSum(void* data, size_t n, DeviceDType type) override {
    return Issue("nccl allreduce", n, false, [=](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(data, data, n, NcclType(type), ncclSum, c, s);
    });
  }

  WorkHandle ReduceScatterSum(const float* in, float* out, size_t n) override {
    return ReduceScatterSum(in, out, n, DeviceDType::kFloat32);
  }
  WorkHandle ReduceScatterSum(const void* in, void* out, size_t n, DeviceDType type) override {
    return Issue("nccl reduce_scatter", n, false, [=](ncclComm_t c, cudaStream_t s) {
      return ncclReduceScatter(in, out, n, NcclType(type), ncclSum, c, s);
    });
  }

  WorkHandle AllGather(const float* in, float* out, size_t n) override {
    return AllGather(in, out, n, DeviceDType::kFloat32);
  }
  WorkHandle AllGather(const void* in, void* out, size_t n, DeviceDType type) override {
    return Issue("nccl allgather", n, false, [=](ncclComm_t c, cudaStream_t s) {
      return ncclAllGather(in, out, n, NcclType(type), c, s);
    });
  }

  WorkHandle Broadcast(float* data, size_t n, int root) override {
    LOOM_CHECK(root >= 0 && root < size_, "broadcast root out of range");
    return Issue("nccl broadcast", n, false, [=](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(data, data, n, ncclFloat32, root, c, s);
    });
  }

  // NCCL has no barrier: an all-reduce of one float completes only once every rank joined.
  WorkHandle Barrier() override {
    float* scratch = scratch_;
    return Issue("nccl barrier", 1, false, [=](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(scratch, scratch, 1, ncclFloat32, ncclSum, c, s);
    });
  }

  WorkHandle Send(const float* data, size_t n, int dst, uint32_t tag) override {
    LOOM_CHECK(dst >= 0 && dst < size_ && dst != rank_, "send destination out of range");
    return Issue("nccl send", n, true, [=](ncclComm_t c, cudaStream_t s) {
      return ncclSend(data, n, ncclFloat32, dst, c, s);
    });
  }

  WorkHandle Recv(float* data, size_t n, int src, uint32_t tag) override {
    LOOM_CHECK(src >= 0 && src < size_ && src != rank_, "recv source out of range");
    return Issue("nccl recv", n, true, [=](ncclComm_t c, cudaStream_t s) {
      return ncclRecv(data, n, ncclFloat32, src, c, s);
    });
  }

  WorkHandle SendRecv(const float* send, size_t send_n, int dst, float* recv, size_t recv_n,
                      int src) override {
    LOOM_CHECK(dst >= 0 && dst < size_ && dst != rank_, "send destination out of range");
    LOOM_CHECK(src >= 0 && src < size_ && src != rank_, "recv source out of range");
    return Issue("nccl sendrecv", send_n + recv_n, true, [=](ncclComm_t c, cudaStream_t s) {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      if (send_n > 0) r = ncclSend(send, send_n, ncclFloat32, dst, c, s);
      if (r == ncclSuccess && recv_n > 0) r = ncclRecv(recv, recv_n, ncclFloat32, src, c, s);
      // The group is closed whatever happened inside it; its result is the first failure.
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }

  void SetComputeStream(cudaStream_t stream) override {
    std::lock_guard<std::mutex> a(issue_mu_);
    std::lock_guard<std::mutex> b(p2p_mu_);
    compute_ = stream;
  }

  void StreamWaitAll(cudaStream_t stream) override {
    std::lock_guard<std::mutex> a(issue_mu_);
    std::lock_guard<std::mutex> b(p2p_mu_);
    if (aborted_.load()) return;
    DeviceGuard guard(device_);
    LOOM_COMM_CUDA(cudaEventRecord(all_done_, stream_));
    LOOM_COMM_CUDA(cudaStreamWaitEvent(stream, all_done_, 0));
    LOOM_COMM_CUDA(cudaEventRecord(p2p_all_done_, p2p_stream_));
    LOOM_COMM_CUDA(cudaStreamWaitEvent(stream, p2p_all_done_, 0));
  }

  void Abort(const std::string& why) override {
    AbortWith("aborted: " + (why.empty() ? std::string("Abort()") : why));
  }

 private:
  struct Pending {
    std::string what;
    WorkHandle work;
    cudaEvent_t done;
    Clock::time_point issued;
  };

  WorkHandle Failed(const std::string& message) {
    auto w = std::make_shared<Work>();
    w->Fail(message);
    return w;
  }

  // Enqueues `op` on the collective (or point-to-point) stream behind the compute stream's
  // work, and returns a Work that the watchdog completes from the op's completion event. A
  // failing CUDA or NCCL call aborts the communicator (its state is unknown after it) and comes
  // back as a failed Work carrying the call's message.
  WorkHandle Issue(const char* what, size_t n, bool p2p,
                   const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& op) {
    std::string error;
    {
      std::lock_guard<std::mutex> lock(p2p ? p2p_mu_ : issue_mu_);
      if (aborted_.load()) return Failed(std::string(what) + ": " + AbortReason());
      ncclComm_t comm = p2p ? p2p_ : comm_;
      if (comm == nullptr) return Failed(std::string(what) + ": no peer in a group of one");
      if (n == 0) return CompletedWork();  // the same on every rank, by the contract
      cudaStream_t stream = p2p ? p2p_stream_ : stream_;
      cudaEvent_t ready = p2p ? p2p_ready_ : ready_;
      try {
        DeviceGuard guard(device_);
        LOOM_COMM_CUDA(cudaEventRecord(ready, compute_));
        LOOM_COMM_CUDA(cudaStreamWaitEvent(stream, ready, 0));
        SettleNccl(comm, op(comm, stream), what, __FILE__, __LINE__, Clock::now() + timeout_,
                   &aborted_);
        cudaEvent_t done = TakeEvent();
        const cudaError_t recorded = cudaEventRecord(done, stream);
        if (recorded != cudaSuccess) ReturnEvent(done);
        LOOM_COMM_CUDA(recorded);
        auto work = std::make_shared<Work>();
        {
          std::lock_guard<std::mutex> q(mu_);
          if (aborted_.load()) {
            // An Abort from another thread emptied the queues after the check above; this
            // operation must fail with the others, not wait for its own timeout.
            work->Fail(std::string(what) + ": " + abort_reason_);
            abandoned_events_.push_back(done);
            return work;
          }
          (p2p ? p2p_pending_ : coll_pending_).push_back(Pending{what, work, done, Clock::now()});
        }
        cv_.notify_all();
        return work;
      } catch (const CommError& e) {
        error = std::string(what) + " on " + label_ + ": " + e.what();
      }
    }
    AbortWith(error);
    return Failed(error);
  }

  cudaEvent_t TakeEvent() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_events_.empty()) {
        cudaEvent_t e = free_events_.back();
        free_events_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    LOOM_COMM_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  void ReturnEvent(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mu_);
    free_events_.push_back(e);
  }

  std::string AbortReason() {
    std::lock_guard<std::mutex> lock(mu_);
    return abort_reason_;
  }

  // Completes the finished operations at the front of `queue` (they finish in order: one
  // stream). Returns a failure message for the first that failed or ran past the timeout, after
  // failing its Work; empty when none did. Called with mu_ held.
  std::string PollLocked(std::deque<Pending>& queue) {
    while (!queue.empty()) {
      Pending& p = queue.front();
      const cudaError_t q = cudaEventQuery(p.done);
      if (q == cudaSuccess) {
        p.work->Complete();
        free_events_.push_back(p.done);
        queue.pop_front();
        continue;
      }
      std::string failure;
      if (q != cudaErrorNotReady) {
        failure = p.what + " on " + label_ + " failed on the device: " + cudaGetErrorName(q) +
                  ": " + cudaGetErrorString(q);
      } else if (Clock::now() - p.issued > timeout_) {
        failure = p.what + " on " + label_ + " timed out after " + Seconds(timeout_) +
                  ": a peer is dead, hung or did not issue it";
      } else {
        return "";
      }
      p.work->Fail(failure);
      abandoned_events_.push_back(p.done);
      queue.pop_front();
      return failure;
    }
    return "";
  }

  // The watchdog: completes Works as their events fire; aborts on a timeout or an asynchronous
  // NCCL error. Sleeps on cv_ while nothing is pending.
  void Watch() {
    cudaSetDevice(device_);
    for (;;) {
      std::string failure;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !coll_pending_.empty() || !p2p_pending_.empty(); });
        if (coll_pending_.empty() && p2p_pending_.empty()) return;  // stopping
        failure = PollLocked(coll_pending_);
        if (failure.empty()) failure = PollLocked(p2p_pending_);
      }
      if (failure.empty()) failure = AsyncError();
      if (!failure.empty()) {
        AbortWith(failure);
        continue;
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }

  // An asynchronous error of either communicator (e.g. a peer's connection broke), as a
  // message; empty when none. Skips a communicator whose issuing thread holds its lock (it
  // polls the same state itself while it waits).
  std::string AsyncError() {
    for (bool p2p : {false, true}) {
      std::unique_lock<std::mutex> lock(p2p ? p2p_mu_ : issue_mu_, std::try_to_lock);
      if (!lock.owns_lock()) continue;
      ncclComm_t comm = p2p ? p2p_ : comm_;
      if (comm == nullptr) continue;
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      const ncclResult_t bad = r != ncclSuccess ? r : state;
      if (bad != ncclSuccess && bad != ncclInProgress) {
        return std::string("NCCL reported an asynchronous error on ") + label_ + ": " +
               NcclMessage(bad, comm);
      }
    }
    return "";
  }

  // Fails every pending Work with "<what>: <reason>", refuses later ones, and aborts both NCCL
  // communicators (their kernels stop; peers see the failure). Idempotent; any thread.
  void AbortWith(const std::string& reason) {
    std::deque<Pending> left;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_.exchange(true)) return;
      abort_reason_ = reason;
      left.swap(coll_pending_);
      for (Pending& p : p2p_pending_) left.push_back(std::move(p));
      p2p_pending_.clear();
      for (Pending& p : left) {
        p.work->Fail(p.what + ": " + reason);
        abandoned_events_.push_back(p.done);
      }
    }
    cv_.notify_all();
    // The issuing threads leave their NCCL calls once they see aborted_ (SettleNccl), so
    // these locks are not held for long.
    std::lock_guard<std::mutex> a(issue_mu_);
    std::lock_guard<std::mutex> b(p2p_mu_);
    DeviceGuardNoThrow guard(device_);
    if (p2p_ != nullptr) ncclCommAbort(p2p_);
    if (comm_ != nullptr) ncclCommAbort(comm_);
    p2p_ = nullptr;
    comm_ = nullptr;
  }

  // DeviceGuard for paths that must not throw (Abort).
  class DeviceGuardNoThrow {
   public:
    explicit DeviceGuardNoThrow(int device) {
      if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
        changed_ = cudaSetDevice(device) == cudaSuccess;
      }
    }
    ~DeviceGuardNoThrow() {
      if (changed_) cudaSetDevice(previous_);
    }

   private:
    int previous_ = 0;
    bool changed_ = false;
  };

  const int rank_;
  const int size_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  const std::string label_;

  std::mutex issue_mu_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  cudaEvent_t all_done_ = nullptr;
  cudaStream_t compute_ = nullptr;  // also read under p2p_mu_; written under both
  float* scratch_ = nullptr;        // the barrier's one float, on the device

  std::mutex p2p_mu_;
  ncclComm_t p2p_ = nullptr;
  cudaStream_t p2p_stream_ = nullptr;
  cudaEvent_t p2p_ready_ = nullptr;
  cudaEvent_t p2p_all_done_ = nullptr;

  std::atomic<bool> aborted_{false};

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> coll_pending_;
  std::deque<Pending> p2p_pending_;
  std::vector<cudaEvent_t> free_events_;
  // Events of failed operations, possibly still pending on an aborted stream: destroyed last.
  std::vector<cudaEvent_t> abandoned_events_;
  std::string abort_reason_;
  bool stop_ = false;
  std::thread watchdog_;  // started by Init, once everything above exists
};

}  // namespace

std::unique_ptr<NcclCommunicator> ConnectNccl(const NcclOptions& o) {
  LOOM_CHECK(o.size >= 1 && o.rank >= 0 && o.rank < o.size, "rank out of [0, size)");
  LOOM_CHECK(o.size == 1 || o.store != nullptr, "a NCCL group of several ranks needs a store");
  LOOM_CHECK(!o.group.empty(), "a NCCL group needs a name");
  const std::string key = o.group + "/nccl-unique-id";
  const std::string where = o.store != nullptr ? o.store->Describe() : "this process";
  const std::string who = "rank " + std::to_string(o.rank) + " of " + std::to_string(o.size);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (o.rank == 0) {
    {
      DeviceGuard guard(o.device);
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) {
        ThrowAt(__FILE__, __LINE__, "ncclGetUniqueId: " + NcclMessage(r, nullptr));
      }
    }
    if (o.size > 1) {
      try {
        o.store->Set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
      } catch (const std::exception& e) {
        throw CommError(who + ": cannot publish the NCCL unique id in " + where + ": " + e.what());
      }
    }
  } else {
    std::string value;
    try {
      value = o.store->Wait({key}, o.timeout).at(0);
    } catch (const std::exception& e) {
      throw CommError(who + ": rank 0's NCCL unique id did not arrive within " +
                      Seconds(o.timeout) + " in " + where + ": " + e.what());
    }
    if (value.size() != sizeof(id)) {
      throw CommError(who + ": the NCCL unique id in " + where + " has " +
                      std::to_string(value.size()) + " bytes, expected " +
                      std::to_string(sizeof(id)));
    }
    std::memcpy(&id, value.data(), sizeof(id));
  }
  auto comm = std::make_unique<NcclComm>(o);
  comm->Init(id, where);
  return comm;
}

}  // namespace loom::train
