// One interface for the collectives of the parallel runtime (DESIGN.md, "Communication"):
// all-reduce (sum), reduce-scatter, all-gather, broadcast, send, recv and barrier on fp32
// buffers, asynchronous with completion handles, plus Abort for failure handling.
//
// Implementations: SingleRankCommunicator (world of one, no library), GlooCommunicator (TCP,
// CPU host buffers; only where CMake found Gloo, LOOM_HAVE_GLOO), NcclCommunicator (GPU device
// buffers, ordered behind a compute stream; only where CUDA and NCCL were found, LOOM_HAVE_NCCL;
// comm/nccl_communicator.h).
//
// Failure contract (every implementation): a dead peer, a hung peer and a lost connection end
// in CommError from Wait() within the communicator's timeout (a dead peer's closed connection
// usually at once), never in a hang; every later operation then fails too, since the gang is
// expected to exit and restart together (DESIGN.md, "Reliability contract").
//
// Threading contract (every implementation):
//   - The collective calls (AllReduceSum, ReduceScatterSum, AllGather, Broadcast, Barrier) are
//     issued from one thread at a time (the training thread) and execute in issue order on the
//     communicator's own thread, so the caller keeps computing while they run. Every rank of the
//     group must issue the same collectives in the same order (as with MPI/NCCL).
//   - Send and Recv may be called from any thread and overlap with the collectives; a pair is
//     matched by (peer, tag), in posting order for equal (peer, tag).
//   - A buffer handed to a call belongs to the communicator until its Work completes: the caller
//     must not read or write it before Wait() returns (a Send's source may be read).
//   - Abort may be called from any thread, at any time, also while other threads are in Wait().
#ifndef LOOM_WORKER_TRAIN_COMM_COMMUNICATOR_H_
#define LOOM_WORKER_TRAIN_COMM_COMMUNICATOR_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

namespace loom::train {

// A collective failed (a peer died, the timeout passed) or was aborted. loom-train exits with
// kExitCrash on it, so the gang restarts instead of hanging.
class CommError : public std::runtime_error {
 public:
  explicit CommError(const std::string& message) : std::runtime_error(message) {}
};

// The completion handle of one operation. Thread-safe: any thread may Wait() or poll Done().
class Work {
 public:
  // Blocks until the operation completed. Throws CommError when it failed or was aborted
  // (Abort wakes every waiter at once, whatever the operation was doing).
  void Wait();
  // True once the operation completed, failed or was aborted (never blocks).
  bool Done() const;

  // For implementations: mark the end. The first call wins; later ones are ignored, so an
  // Abort racing the normal completion is harmless.
  void Complete();
  void Fail(const std::string& message);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string error_;  // non-empty when failed
};
using WorkHandle = std::shared_ptr<Work>;

// A Work that is already complete (what a world of one returns).
WorkHandle CompletedWork();

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data (n) := the elementwise sum of every rank's data (n). In place.
  virtual WorkHandle AllReduceSum(float* data, size_t n) = 0;

  // in (size * n) on every rank; out (n) := sum over ranks of in[rank() * n, (rank() + 1) * n).
  virtual WorkHandle ReduceScatterSum(const float* in, float* out, size_t n) = 0;

  // in (n) on every rank; out (size * n) := every rank's in, in rank order.
  virtual WorkHandle AllGather(const float* in, float* out, size_t n) = 0;

  // data (n) := root's data (n) on every rank. In place.
  virtual WorkHandle Broadcast(float* data, size_t n, int root) = 0;

  // Point to point: data (n) goes to rank `dst` (which posts a Recv with the same tag), or
  // arrives from rank `src`. Not queued behind the collectives (see the threading contract).
  virtual WorkHandle Send(const float* data, size_t n, int dst, uint32_t tag) = 0;
  virtual WorkHandle Recv(float* data, size_t n, int src, uint32_t tag) = 0;

  // Completes once every rank has issued its Barrier.
  virtual WorkHandle Barrier() = 0;

  // Fails every pending and future operation with CommError("aborted: " + why) and unblocks
  // every waiter. The communicator is unusable afterwards; the process is expected to exit.
  // Buffers of operations that were executing may still be touched until the destructor returns
  // (it joins the communication thread, which leaves a stuck transport call at the timeout).
  virtual void Abort(const std::string& why) = 0;
};

// A group of one rank: every collective is the identity (the sum over one rank is its own
// value) and completes at once. Send and Recv have no peer and are refused (LOOM_CHECK).
class SingleRankCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  WorkHandle AllReduceSum(float* data, size_t n) override;
  WorkHandle ReduceScatterSum(const float* in, float* out, size_t n) override;
  WorkHandle AllGather(const float* in, float* out, size_t n) override;
  WorkHandle Broadcast(float* data, size_t n, int root) override;
  WorkHandle Send(const float* data, size_t n, int dst, uint32_t tag) override;
  WorkHandle Recv(float* data, size_t n, int src, uint32_t tag) override;
  WorkHandle Barrier() override;
  void Abort(const std::string& why) override;

 private:
  WorkHandle Result();
  std::mutex mu_;
  std::string aborted_;  // non-empty after Abort
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_COMM_COMMUNICATOR_H_
