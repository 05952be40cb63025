// Test role: ThreadNccl stands in for NCCL in the CPU emulation (there is no NCCL library and no
// device here), so that several emulated GPU ranks — host threads of one process — can train
// one model together through the real step loop (Trainer) and CUDA backend (CudaBackend).
//
// The turn: the emulator is not thread-safe (a kernel's __shared__ memory is a static, and
// blocks run on the launching thread), so exactly one rank thread runs at a time. A rank takes
// the turn (TakeTurn) before it builds anything and gives it back when it is done; a rank that
// must wait for its peers (in a collective, or a Recv whose message has not been sent) hands
// the turn over while it waits and takes it back after.
//
// Semantics, as NCCL's where the training code depends on them:
//   - a collective completes when every rank of the group has entered it; the last one to
//     arrive combines every rank's buffer (sums in rank order; bf16 sums accumulate in fp32 and
//     round to bf16 after each addition, as NCCL's ring rounds after each step) and writes each
//     rank's result; ranks that call different collectives (kind, count or type) abort;
//   - point-to-point messages are matched in posting order per (sender, receiver) of a group,
//     not by tag; a send is eager (its buffer is copied at once, so it completes at once);
//   - every operation completes before the call returns (Work is complete, StreamWaitAll has
//     nothing to wait for), which is a legal order of NCCL's asynchronous execution;
//   - a rank that waits longer than LOOM_EMU_NCCL_TIMEOUT_S seconds (default 120) aborts the
//     process with the operation, the group and the ranks that did not arrive: a hang in the
//     training code's communication order fails loudly instead of hanging the test.
// What it cannot check: stream ordering, overlap and timing on a device, and NCCL's own
// deadlocks between concurrent groups (everything here is synchronous).
#ifndef LOOM_TESTS_GPU_EMU_THREAD_NCCL_H_
#define LOOM_TESTS_GPU_EMU_THREAD_NCCL_H_

#include <memory>
#include <string>

#include "worker/train/comm/nccl_communicator.h"

namespace loom::emu {

// The one turn of the process (see above).
void TakeTurn();
void GiveTurn();

struct ThreadGroup;  // the state the ranks of one group share

class ThreadNccl : public train::NcclCommunicator {
 public:
  // Rank `rank` of the group instance named `group` (every rank of it passes the same name and
  // size; a name used again after all its ranks are gone starts a new group).
  ThreadNccl(const std::string& group, int rank, int size);
  ~ThreadNccl() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  train::WorkHandle AllReduceSum(float* data, size_t n) override;
  train::WorkHandle ReduceScatterSum(const float* in, float* out, size_t n) override;
  train::WorkHandle AllGather(const float* in, float* out, size_t n) override;
  train::WorkHandle Broadcast(float* data, size_t n, int root) override;
  train::WorkHandle Send(const float* data, size_t n, int dst, uint32_t tag) override;
  train::WorkHandle Recv(float* data, size_t n, int src, uint32_t tag) override;
  train::WorkHandle Barrier() override;
  void Abort(const std::string& why) override;
  train::WorkHandle AllReduceSum(void* data, size_t n, train::DeviceDType type) override;
  train::WorkHandle ReduceScatterSum(const void* in, void* out, size_t n,
                                     train::DeviceDType type) override;
  train::WorkHandle AllGather(const void* in, void* out, size_t n,
                              train::DeviceDType type) override;
  train::WorkHandle SendRecv(const float* send, size_t send_n, int dst, float* recv, size_t recv_n,
                             int src) override;
  void SetComputeStream(cudaStream_t) override {}
  cudaStream_t stream() const override { return stream_; }
  void StreamWaitAll(cudaStream_t) override {}  // every operation completed when issued
  int device() const override { return 0; }

 private:
  enum class Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier };
  train::WorkHandle Collective(Kind kind, const void* in, void* out, size_t n,
                               train::DeviceDType type, int root);

  std::string name_;
  int rank_;
  int size_;
  std::shared_ptr<ThreadGroup> group_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace loom::emu

#endif  // LOOM_TESTS_GPU_EMU_THREAD_NCCL_H_
