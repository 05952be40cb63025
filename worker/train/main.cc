// loom-train: the training process, one per device (DESIGN.md, "The training core").
// The entry point is the one place that may bring in gRPC: where loom-train is built with it
// (LOOM_HAVE_GRPC_RENDEZVOUS, not under LOOM_TRAIN_ONLY), it hands the training core the
// client of loomd's RendezvousService for LOOM_RENDEZVOUS. Where it is built with the CUDA
// backend (LOOM_HAVE_CUDA_TRAINER), it hands over the GPU backend for --device cuda as well,
// and says whether that backend can run data parallelism (NCCL: LOOM_HAVE_NCCL).
#include <sys/prctl.h>

#include <csignal>
#include <cstdlib>
#include <string>
#include <vector>

#include "worker/train/diag/stack_dump.h"
#include "worker/train/diag/stop_request.h"
#include "worker/train/run.h"
#ifdef LOOM_HAVE_GRPC_RENDEZVOUS
#include "worker/train/comm/grpc_rendezvous_store.h"
#endif
#ifdef LOOM_HAVE_CUDA_TRAINER
#include "worker/train/cuda_backend.h"
#include "worker/train/device/cuda_memory.h"
#endif

int main(int argc, char** argv) {
  // The ranks of every job on a node run as one user (loom-worker's --rank-user), so another
  // job's rank, or any process of that user, could read this one's /proc/PID/environ (the
  // job's rendezvous secret, its spec.env values), memory and descriptors. A process that is
  // not dumpable has those files owned by root and cannot be attached to by its own user. (Core
  // dumps go with it; a rank's failure is reported on stderr.)
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  // A closed progress pipe must surface as EPIPE (reported, then skipped), not kill the rank.
  std::signal(SIGPIPE, SIG_IGN);
  // loom-worker asks for stacks with SIGUSR1 when the job stops making progress.
  loom::train::InstallStackDumpHandler();
  // loom-worker asks for a checkpoint and a stop with SIGUSR2 when the node drains.
  loom::train::InstallStopRequestHandler();
  std::vector<std::string> args(argv + 1, argv + argc);
  loom::train::RunOptions options;
  options.stop_requested = &loom::train::StopRequested;
#ifdef LOOM_HAVE_GRPC_RENDEZVOUS
  options.service_store = &loom::train::OpenGrpcRendezvousStore;
#endif
#ifdef LOOM_HAVE_CUDA_TRAINER
  options.cuda_backend = &loom::train::MakeCudaRankBackend;
  options.cuda_device_count = &loom::train::CudaDeviceCount;
#ifdef LOOM_HAVE_NCCL
  // The CUDA backend's data parallelism (cuda_grad_sync.h) is built only with NCCL.
  options.cuda_data_parallel = true;
#endif
#endif
  return loom::train::RunLoomTrain(
      args, [](const char* name) { return std::getenv(name); }, options);
}
