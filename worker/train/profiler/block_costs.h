// Per-block cost of one step (issue 12, part 1): forward and backward wall seconds of each
// transformer block this rank holds, of the embedding (first pipeline stage) and of the head and
// loss (last stage), each summed over the step's micro-batches.
//
// Sampled: the trainer measures every kBlockSampleEvery-th step only, so that the extra clock
// reads (two per block per micro-batch and direction, on the CPU a few tens of nanoseconds each)
// stay far below 1 % of the step, and a backend whose clock needs a device synchronisation
// (CUDA) pays it on one step in kBlockSampleEvery. The measured figures feed loomd's doctor,
// which re-splits pipeline stages from them (server/doctor).
#ifndef LOOM_WORKER_TRAIN_PROFILER_BLOCK_COSTS_H_
#define LOOM_WORKER_TRAIN_PROFILER_BLOCK_COSTS_H_

#include <chrono>
#include <cstdint>
#include <vector>

namespace loom::train {

// Steps between two sampled steps: steps kBlockSampleEvery, 2 * kBlockSampleEvery, ... (1-based)
// carry block costs. Small enough that loomd's doctor sees a fresh sample within a few seconds
// of a short CPU job, large enough that the timing costs nothing measurable (docs/benchmarks.md).
inline constexpr int64_t kBlockSampleEvery = 4;

struct BlockCosts {
  int first_block = 0;           // global index of forward[0] / backward[0]
  std::vector<double> forward;   // seconds per block of this stage, summed over micro-batches
  std::vector<double> backward;  // same size as forward
  bool has_embedding = false;    // first stage: the token + position embedding
  double embedding_forward = 0.0;
  double embedding_backward = 0.0;
  bool has_head = false;  // last stage: final layernorm, logits, softmax + loss
  double head_forward = 0.0;
  double head_backward = 0.0;

  // Empties the figures for a stage of `blocks` blocks starting at `first`.
  void Reset(int first, int blocks) {
    first_block = first;
    forward.assign(static_cast<size_t>(blocks), 0.0);
    backward.assign(static_cast<size_t>(blocks), 0.0);
    has_embedding = has_head = false;
    embedding_forward = embedding_backward = head_forward = head_backward = 0.0;
  }
};

// A stopwatch: Lap() returns the seconds since construction or the previous Lap().
class Lap {
 public:
  Lap() : last_(std::chrono::steady_clock::now()) {}
  double operator()() {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return s;
  }

 private:
  std::chrono::steady_clock::time_point last_;
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_PROFILER_BLOCK_COSTS_H_
