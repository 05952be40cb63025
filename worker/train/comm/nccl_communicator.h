// The NCCL implementation of Communicator, for GPU ranks (DESIGN.md, "Communication"). Compiled
// only where the CUDA backend is on and CMake found NCCL (LOOM_HAVE_NCCL); this header names no
// NCCL type, only the CUDA runtime's stream.
//
// Buffers are DEVICE pointers on the communicator's device (fp32 through the Communicator
// interface; bf16 through the typed overloads below).
//
// Ordering, without blocking the host: the communicator owns a non-blocking CUDA stream. A call
// records an event on the caller's compute stream (SetComputeStream; the legacy default stream
// until set) and makes the communication stream wait for it, so the operation starts on the
// device once the work that produced its inputs is done; the host returns at once. Its Work
// completes when the NCCL operation has finished on the device (a watchdog thread polls the
// operation's completion event). To consume a result on a stream without blocking the host, use
// StreamWaitAll instead of Wait.
//
// Failure: the NCCL communicators are non-blocking (ncclConfig_t::blocking = 0), so no NCCL call
// can hang the host. The watchdog fails an operation, and aborts the communicator
// (ncclCommAbort), when it has not finished within the timeout or NCCL reports an asynchronous
// error (ncclCommGetAsyncError, e.g. a dead peer); every pending and later Work then fails with
// CommError. Every CUDA and NCCL call is checked: a failure throws CommError with the file, the
// line, the call and the library's message.
//
// Threading: as Communicator. Collectives from one thread at a time; Send and Recv from any
// thread, on a second NCCL communicator and stream of their own (so they never queue behind a
// collective). NCCL matches point-to-point operations by order, not by tag: between two ranks,
// Sends and Recvs must be posted in the same order on both sides, and since they execute in
// posting order on one stream, a rank that must both send and receive posts them in an order
// that its peer mirrors (a ring exchange posting Send before Recv on every rank deadlocks for
// messages beyond NCCL's internal buffering; SendRecv fuses the two). The tag is not used by
// NCCL.
#ifndef LOOM_WORKER_TRAIN_COMM_NCCL_COMMUNICATOR_H_
#define LOOM_WORKER_TRAIN_COMM_NCCL_COMMUNICATOR_H_

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "worker/train/comm/communicator.h"
#include "worker/train/comm/key_value_store.h"

namespace loom::train {

struct NcclOptions {
  int rank = 0;
  int size = 1;
  // The CUDA device of this rank; every buffer handed to the communicator lives there.
  int device = 0;
  // Where rank 0 publishes the NCCL unique id and the others read it (not owned; used only
  // during ConnectNccl). Needed when size > 1.
  KeyValueStore* store = nullptr;
  // Scopes the unique id's key in the store ("<group>/nccl-unique-id"), so several groups (the
  // world, and the tensor, data and pipeline groups) can meet through one store.
  std::string group = "world";
  // Initialisation and every operation fail with CommError after this long (a dead or hung
  // peer must not hang the gang).
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  // The stream whose work produces the inputs of the collectives; nullptr is the legacy default
  // stream. SetComputeStream changes it later.
  cudaStream_t compute_stream = nullptr;
};

// Element types of the typed overloads.
enum class DeviceDType { kFloat32, kBFloat16 };

class NcclCommunicator : public Communicator {
 public:
  // The fp32 calls of the interface stay visible beside the typed overloads.
  using Communicator::AllGather;
  using Communicator::AllReduceSum;
  using Communicator::ReduceScatterSum;

  // As the fp32 calls, for `type` elements. bf16 sums are rounded to bf16 after every reduction
  // step inside NCCL, so their error grows with the group size: reduce fp32 where results must
  // agree across layouts.
  virtual WorkHandle AllReduceSum(void* data, size_t n, DeviceDType type) = 0;
  virtual WorkHandle ReduceScatterSum(const void* in, void* out, size_t n, DeviceDType type) = 0;
  virtual WorkHandle AllGather(const void* in, void* out, size_t n, DeviceDType type) = 0;

  // Sends `send` (send_n) to `dst` and receives `recv` (recv_n) from `src` as one fused NCCL
  // group on the point-to-point stream: the exchange of a ring or of a pipeline's steady state,
  // which separate Send and Recv calls can deadlock (see the header comment). Either count may
  // be 0. From any thread, like Send and Recv.
  virtual WorkHandle SendRecv(const float* send, size_t send_n, int dst, float* recv, size_t recv_n,
                              int src) = 0;

  // The stream later operations wait for (see the header comment). Call from the thread that
  // issues the collectives, between operations.
  virtual void SetComputeStream(cudaStream_t stream) = 0;

  // The communication stream of the collectives (for profiling: events recorded on it).
  virtual cudaStream_t stream() const = 0;

  // Makes `stream` wait, on the device, for every operation issued so far (collectives and
  // point-to-point); the host does not block. After an Abort the wait may never be satisfied
  // on the device, which is why loom-train exits on CommError.
  virtual void StreamWaitAll(cudaStream_t stream) = 0;

  virtual int device() const = 0;
};

// Connects this rank's NCCL communicators: rank 0 creates the unique id and publishes it in the
// store, the others wait for it; all then initialise together. Blocks until every rank joined.
// Throws CommError when the store fails, a peer does not join within the timeout, or a CUDA or
// NCCL call fails (e.g. no device); LOOM_CHECKs the options.
std::unique_ptr<NcclCommunicator> ConnectNccl(const NcclOptions& options);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_COMM_NCCL_COMMUNICATOR_H_
