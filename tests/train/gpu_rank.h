// A GPU rank for the tests of the CUDA backend: the backend from the CUDA build's factory
// (MakeCudaRankBackend, with its NCCL groups for a world of more than one), behind the one step
// loop (Trainer), as loom-train builds it.
#ifndef LOOM_TESTS_TRAIN_GPU_RANK_H_
#define LOOM_TESTS_TRAIN_GPU_RANK_H_

#include <memory>

#include "worker/train/comm/bootstrap.h"
#include "worker/train/cuda_backend.h"
#include "worker/train/parallel/process_groups.h"
#include "worker/train/trainer.h"

namespace loom::train::testing {

struct GpuRank {
  ProcessGroups groups;              // outlives the trainer (declared first)
  std::unique_ptr<Trainer> trainer;  // over the CUDA backend

  Trainer& operator*() { return *trainer; }
  Trainer* operator->() { return trainer.get(); }
  GptCuda& model() { return static_cast<CudaBackend&>(trainer->backend()).model(); }
};

// One rank of `shape` on CUDA device `device`; `rendezvous` says how a world of more than one
// meets (unused otherwise).
inline std::unique_ptr<GpuRank> MakeGpuRank(const JobConfig& config, const BatchShape& shape,
                                            const Dataset& data, int device,
                                            const RendezvousConfig& rendezvous = {},
                                            size_t bucket_bytes = kDefaultBucketBytes) {
  auto rank = std::make_unique<GpuRank>();
  std::unique_ptr<Backend> backend =
      MakeCudaRankBackend(config, shape, device, rendezvous, bucket_bytes, &rank->groups);
  const ProcessGroups& g = rank->groups;
  TrainerOptions options;
  options.bucket_bytes = bucket_bytes;
  rank->trainer = std::make_unique<Trainer>(
      config, shape, data,
      TrainerComms{g.world.get(), g.dp.get(), g.tp.get(), g.pp.get(), g.emb.get(), g.pp_grad.get()},
      options, std::move(backend));
  return rank;
}

}  // namespace loom::train::testing

#endif  // LOOM_TESTS_TRAIN_GPU_RANK_H_
