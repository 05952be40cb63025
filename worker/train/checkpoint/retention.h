// Checkpoint retention (checkpoint.keep): after a checkpoint is committed, the committing rank
// removes the oldest complete checkpoints so that at most `keep` remain.
//
// Contract: only complete checkpoints (step-N with a manifest) are candidates; staging
// directories (*.partial: being written, or left by a crash and cleaned by CommitCheckpoint) are
// never touched, and the newest complete checkpoint is never removed whatever `keep` says.
// keep = 0 keeps everything. A removal that fails is reported on stderr with errno and skipped:
// retention must not fail a run that has just saved.
#ifndef LOOM_WORKER_TRAIN_CHECKPOINT_RETENTION_H_
#define LOOM_WORKER_TRAIN_CHECKPOINT_RETENTION_H_

#include <cstdint>
#include <string>
#include <vector>

namespace loom::train {

// Removes the complete checkpoints under `root` beyond the newest `keep` and returns the
// directories removed, oldest first.
std::vector<std::string> PruneCheckpoints(const std::string& root, int64_t keep);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_CHECKPOINT_RETENTION_H_
