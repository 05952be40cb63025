// A trainer that runs the model on an accelerator instead of the CPU (issue 5): the interface
// run.cc drives, so that the training core's entry (run.cc, in loom_train_core) needs no CUDA
// header. The CUDA implementation (cuda_trainer.h) lives in loom_train_cuda, which the entry
// point hands in through RunOptions where the build has it.
#ifndef LOOM_WORKER_TRAIN_DEVICE_TRAINER_H_
#define LOOM_WORKER_TRAIN_DEVICE_TRAINER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/comm/bootstrap.h"
#include "worker/train/config/job_config.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/data/dataset.h"
#include "worker/train/trainer.h"

namespace loom::train {

class DeviceTrainer {
 public:
  virtual ~DeviceTrainer() = default;
  // One optimizer step; the same StepResult (and so the same progress line) as Trainer::Step.
  // Throws InputError when the loss is not finite.
  virtual StepResult Step() = 0;
  // Mean loss over the fixed validation batches (as Trainer::Evaluate).
  virtual float Evaluate() = 0;
  virtual int64_t step() const = 0;  // completed optimizer steps
  virtual size_t num_params() const = 0;

  // Saves a checkpoint of the current state (the fp32 master weights and AdamW moments, in the
  // CPU trainer's format, so either device resumes it) under `root` at step() and returns its
  // directory. Throws IoError; existing checkpoints are then untouched.
  virtual std::string Save(const std::string& root, int64_t generation) = 0;

  // Continues from the checkpoint in `dir`, written by any trainer under any layout: the
  // weights, the moments, the optimizer step and step(). Throws InputError when it does not fit
  // this model (checkpoint.h, LoadShardedCheckpoint).
  virtual CheckpointMeta Resume(const std::string& dir) = 0;

  // Every data-parallel rank's `step` (the newest checkpoint each rank found, -1 for none), in
  // rank order, so that run.cc refuses a gang whose ranks would resume from different
  // checkpoints (as AgreeOnResume on the CPU). A collective: every rank calls it, before Resume.
  // One rank: {step}.
  virtual std::vector<int64_t> GatherResumeSteps(int64_t step) { return {step}; }

  // The rank's timeline (profiler/trace_recorder.h; not owned, outlives the trainer; nullptr:
  // none): every step's phases become records. A trainer that records none ignores it.
  virtual void set_trace(TraceRecorder* trace) { (void)trace; }
};

// What a device trainer needs beyond the job: how to meet its data-parallel peers (dp > 1) and
// how to bucket their gradient all-reduce.
struct DeviceTrainerOptions {
  // The rendezvous of this rank (run.cc builds it as for the CPU's communicators): the store
  // where the NCCL unique id is exchanged, and LOOM_COMM_TIMEOUT_S.
  RendezvousConfig rendezvous;
  size_t bucket_bytes = kDefaultBucketBytes;  // --dp-bucket-mb
  bool dp_overlap = true;                     // --dp-overlap: all-reduce buckets during backward
};

// Builds a device trainer for one rank that holds the whole model (tp = pp = 1) on device
// `device`; with shape.dp_size > 1 it connects to its data-parallel peers through
// options.rendezvous (blocking until they all joined). Throws InputError when the device does
// not exist or the build cannot run data parallelism there (checked before connecting), and
// CommError when the peers do not meet.
using DeviceTrainerFactory = std::function<std::unique_ptr<DeviceTrainer>(
    const JobConfig& config, const BatchShape& shape, const Dataset& data, int device,
    const DeviceTrainerOptions& options)>;

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_DEVICE_TRAINER_H_
