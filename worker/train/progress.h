// Progress output of loom-train (docs/rank-contract.md, "Progress lines"): one JSON object per
// line on stdout and, when LOOM_PROGRESS_FD is set, on that file descriptor; a human-readable
// line on stderr when stderr is a terminal.
#ifndef LOOM_WORKER_TRAIN_PROGRESS_H_
#define LOOM_WORKER_TRAIN_PROGRESS_H_

#include <cstdint>
#include <string>

#include "worker/train/trainer.h"

namespace loom::train {

// The "block_seconds" object of a sampled step line: {"first_block":F,"forward":[...],
// "backward":[...],"embedding":[f,b],"head":[f,b]} (the last two on the first and the last
// pipeline stage only).
std::string BlockSecondsJson(const BlockCosts& costs);

class Progress {
 public:
  // progress_fd < 0: no progress fd. human: also print readable lines on stderr.
  Progress(int rank, int64_t total_steps, int progress_fd, bool human);

  void Step(const StepResult& r);
  void Eval(int64_t step, float val_loss);
  // `seconds`: how long the save took on this rank (every rank waited for it).
  void Checkpoint(int64_t step, const std::string& dir, double seconds);

  // The JSON line of a step (without the newline); public for tests.
  std::string StepJson(const StepResult& r) const;

 private:
  // Writes `json` + "\n" to stdout and the progress fd. A broken progress fd (the worker went
  // away) is reported once on stderr and then skipped.
  void Emit(const std::string& json);

  int rank_;
  int64_t total_steps_;
  int fd_;
  bool human_;
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_PROGRESS_H_
