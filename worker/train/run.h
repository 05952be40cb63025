// The loom-train program as a function, so that tests can drive it in-process as well.
#ifndef LOOM_WORKER_TRAIN_RUN_H_
#define LOOM_WORKER_TRAIN_RUN_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/train/backend.h"
#include "worker/train/comm/bootstrap.h"
#include "worker/train/comm/key_value_store.h"
#include "worker/train/config/job_config.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/parallel/process_groups.h"

namespace loom::train {

// Builds the CUDA backend of one rank (cuda_backend.h) on CUDA device `device`, and connects
// the rank's NCCL groups of more than one rank into *groups (groups of one become
// SingleRankCommunicators) through `rendezvous` (unused for a world of one) — the groups
// outlive the backend. Buckets of `bucket_bytes` for the data-parallel gradients. Throws
// InputError when the device does not exist or the build cannot run the layout (checked before
// connecting), CommError when the peers do not meet.
using CudaBackendFactory = std::function<std::unique_ptr<Backend>(
    const JobConfig& config, const BatchShape& shape, int device,
    const RendezvousConfig& rendezvous, size_t bucket_bytes, ProcessGroups* groups)>;

struct RunOptions {
  // Opens loomd's RendezvousService store (LOOM_RENDEZVOUS); empty in a build without gRPC,
  // where LOOM_RENDEZVOUS with more than one rank is a configuration error (exit 2).
  KeyValueStoreFactory service_store;
  // Builds the CUDA backend for --device cuda or LOOM_DEVICE=cuda:N; empty in a build without
  // it, where --device cuda is a configuration error (exit 2).
  CudaBackendFactory cuda_backend;
  // The number of CUDA devices (with cuda_backend): LOOM_DEVICE=cuda:N names a device that
  // does not exist here -> the CPU, with a note, as in a build without CUDA.
  std::function<int()> cuda_device_count;
  // True where cuda_backend can run more than one rank (any layout, ZeRO-1 included) over NCCL:
  // a build with NCCL (LOOM_HAVE_NCCL). Otherwise --device cuda refuses a world of more than one
  // (exit 2).
  bool cuda_data_parallel = false;
  // Whether this rank was asked to stop with its work kept (loom-train: SIGUSR2,
  // diag/stop_request.h). The gang agrees on a step, saves a checkpoint there when it has a
  // checkpoint directory, and RunLoomTrain returns kExitStopped. Empty: never asked.
  std::function<bool()> stop_requested;
};

// Runs loom-train with `args` (argv without the program name) and the environment read through
// `getenv` (nullptr for unset). Returns the exit status: kExitOk, kExitBadInput (a one-line
// error on stderr naming the file or field), kExitCrash or kExitStopped.
int RunLoomTrain(const std::vector<std::string>& args,
                 const std::function<const char*(const char*)>& getenv,
                 const RunOptions& options = {});

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_RUN_H_
