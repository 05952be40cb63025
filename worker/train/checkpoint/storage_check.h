// Storage preflight: before the first step, every rank checks that checkpoint.dir can take a
// checkpoint, so that a read-only, full or too-long directory fails the job at once and for
// good (exit 2, permanent: restarting cannot fix it) instead of after hours of training, or in
// a loop of restarts that each fail at their first save.
//
// Checks, in order (each failure is an InputError naming checkpoint.dir, the directory and the
// system's errno text):
//   1. the path leaves room for the longest name a checkpoint writes under it (PATH_MAX);
//   2. the directory exists or can be created;
//   3. a probe file can be created, written, fsynced and removed (read-only file systems,
//      permissions, quotas, a disk already full);
//   4. the file system has at least `bytes_needed` free (statvfs, space available to us).
#ifndef LOOM_WORKER_TRAIN_CHECKPOINT_STORAGE_CHECK_H_
#define LOOM_WORKER_TRAIN_CHECKPOINT_STORAGE_CHECK_H_

#include <cstdint>
#include <string>

#include "worker/train/model/dims.h"

namespace loom::train {

// About how many bytes one complete checkpoint of a model of `dims` takes on disk: fp32
// parameters and AdamW's two moments (12 bytes a parameter), whatever the layout.
uint64_t CheckpointBytesEstimate(const ModelDims& dims);

// Runs the checks above on `root`. Throws InputError.
void CheckCheckpointStorage(const std::string& root, uint64_t bytes_needed);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CHECKPOINT_STORAGE_CHECK_H_
