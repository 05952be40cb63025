// The loom-train program as a function, so that tests can drive it in-process as well.
#ifndef LOOM_WORKER_TRAIN_RUN_H_
#define LOOM_WORKER_TRAIN_RUN_H_

#include <functional>
#include <string>
#include <vector>

#include "worker/train/comm/key_value_store.h"
#include "worker/train/device_trainer.h"

namespace loom::train {

// What the entry point supplies beyond argv and the environment: the pieces built outside the
// training core (DESIGN.md: the core never includes gRPC or protobuf).
struct RunOptions {
  // Opens loomd's RendezvousService store (LOOM_RENDEZVOUS); empty in a build without gRPC,
  // where LOOM_RENDEZVOUS with more than one rank is a configuration error (exit 2).
  KeyValueStoreFactory service_store;
  // Builds the CUDA trainer (cuda_trainer.h) for --device cuda or LOOM_DEVICE=cuda:N; empty in
  // a build without the CUDA backend, where --device cuda is a configuration error (exit 2).
  DeviceTrainerFactory cuda_trainer;
  // The number of CUDA devices (with cuda_trainer): LOOM_DEVICE=cuda:N names a device that
  // does not exist here -> the CPU, with a note, as in a build without CUDA.
  std::function<int()> cuda_device_count;
  // True where cuda_trainer can run data parallelism (dp > 1, tp = pp = 1) over NCCL: a build
  // with NCCL (LOOM_HAVE_NCCL). Otherwise --device cuda refuses dp > 1 (exit 2).
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
