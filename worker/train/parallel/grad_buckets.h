// Data-parallel gradient reduction with overlap (DESIGN.md, "DP"): the gradient buffer is cut
// into pieces (one tensor, or one layer's slice of a stacked (L, ...) tensor), the pieces are
// ordered the way backward finishes them (final layernorm, blocks L-1 down to 0, embeddings)
// and packed greedily into buckets of at most `bucket_bytes` (a larger piece gets a bucket of
// its own): PlanGradBuckets, the pure part, which the GPU's buckets (cuda_grad_sync.h) share.
// When backward reports a stage final, every bucket whose pieces are all final is packed into
// its own buffer and its all-reduce (sum) is queued on the communicator's thread,
// while backward continues. Finish waits for all of them and writes the mean back.
//
// Cost: one extra gradient-sized buffer (the buckets), and one pack and unpack copy per step.
// Threading: every method runs on the training thread; the communicator's thread touches only
// the bucket buffers, between a bucket's launch and Finish.
#ifndef LOOM_WORKER_TRAIN_PARALLEL_GRAD_BUCKETS_H_
#define LOOM_WORKER_TRAIN_PARALLEL_GRAD_BUCKETS_H_

#include <chrono>
#include <cstddef>
#include <vector>

#include "worker/train/comm/communicator.h"
#include "worker/train/model/padded_layout.h"
#include "worker/train/model/params.h"

namespace loom::train {

inline constexpr size_t kDefaultBucketBytes = size_t{25} << 20;  // 25 MiB

// A contiguous run of the gradient buffer that becomes final at once: a whole tensor, or one
// layer's slice of a stacked (L, ...) tensor.
struct GradPiece {
  size_t offset = 0;  // in elements, from the start of the gradient buffer
  size_t numel = 0;
  int stage = 0;  // final after this backward stage (L .. 0, then -1: GradReadyFn's numbering)
};

// Pieces that are reduced together, in one buffer, by one collective.
struct GradBucketPlan {
  std::vector<GradPiece> pieces;  // in backward order
  int last_stage = 0;             // the bucket is final once this stage is (its last piece's)
  size_t numel = 0;               // sum of the pieces' numel
};

// The pure part of the bucketing, shared by the CPU (GradBuckets, fp32) and the GPU
// (cuda_grad_sync.h, bf16): cuts `table` into pieces, ordered as backward finishes them (lnfb,
// lnfw and a last stage's own copy of wte at stage L; then for blocks L-1 down to 0 their slices
// in the order the block's backward writes them; then wpe and wte at stage -1), and packs them
// greedily into buckets of at most `bucket_bytes` / `bytes_per_element` elements (a larger piece
// gets a bucket of its own). Buckets come in launch order, their last_stage non-increasing.
// `layers` is L of the whole model; `table` may be a pipeline stage's ShardTable (see
// GradBuckets). The pieces cover every element of the table exactly once (LOOM_CHECKed).
std::vector<GradBucketPlan> PlanGradBuckets(const std::vector<TensorInfo>& table, int layers,
                                            size_t bucket_bytes, size_t bytes_per_element);

// The same buckets over a buffer laid out by `layout` (the GPU model's padded vocabulary,
// model/padded_layout.h) instead of the table: every piece moves by its tensor's shift, and the
// wte piece (whole wte, required) grows to include its padding rows, whose gradient is zero, so
// reducing them changes nothing. A bucket holding wte may then exceed the plan's bucket size by
// the padding, (Vp - V) * C elements. `table` is the whole model's (the layout's).
std::vector<GradBucketPlan> ToPaddedLayout(const std::vector<GradBucketPlan>& buckets,
                                           const std::vector<TensorInfo>& table,
                                           const PaddedLayout& layout);

class GradBuckets {
 public:
  // `comm` is the data-parallel group (outlives this); `layers` is L of the whole model.
  // `table` may be a pipeline stage's ShardTable: the stacked tensors then hold blocks
  // [box_start[0], box_start[0] + shape[0]), tensors with numel 0 are skipped, and a last
  // stage's copy of wte (held without wpe) is final with the head, at stage L.
  GradBuckets(const std::vector<TensorInfo>& table, int layers, size_t bucket_bytes,
              Communicator* comm);

  // Starts a step's reduction of `grads` (num_params floats); nothing is launched yet.
  void Begin(float* grads);
  // Backward's GradReadyFn for the LAST micro-batch of a step: launches the buckets now final.
  void StageReady(int stage);
  // Launches what is left, waits for every bucket, and replaces the gradients by their mean
  // over the group. Returns the seconds spent waiting (the exposed communication). Throws
  // CommError when a collective failed.
  double Finish();

  // Seconds the last Finish's all-reduces kept the communication thread busy, estimated from
  // each bucket's launch and the moment its completion was first seen (polled at every
  // StageReady, and at Finish): sum over buckets of done - max(launch, previous done). An
  // upper bound by at most one backward stage per bucket. The overlap ratio of a step is
  // 1 - exposed / this.
  double comm_seconds() const { return comm_seconds_; }

  // Each bucket's stretch on the communication thread in the last Finish, in launch order: from
  // max(its launch, the previous bucket's done) to its done (the trace's dp events).
  struct Span {
    std::chrono::steady_clock::time_point began, done;
    size_t bytes = 0;
  };
  const std::vector<Span>& spans() const { return spans_; }

  size_t num_buckets() const { return buckets_.size(); }
  // Bytes all-reduced per step (fp32 gradients).
  size_t bytes_per_step() const { return total_floats_ * sizeof(float); }

 private:
  struct Bucket {
    std::vector<GradPiece> pieces;  // in backward order (offsets in floats)
    int last_stage = 0;             // the bucket is final once this stage is
    std::vector<float> buffer;      // (sum of the pieces' numel), packed
    WorkHandle work;                // set once launched
    std::chrono::steady_clock::time_point launched{}, done{};  // done: zero until seen
  };
  void Launch(Bucket& b);
  void Poll();  // records the completion time of launched buckets that have finished

  Communicator* comm_;
  std::vector<Bucket> buckets_;  // in launch order
  size_t total_floats_ = 0;
  float* grads_ = nullptr;
  size_t next_ = 0;  // the first bucket not launched this step
  double comm_seconds_ = 0.0;
  std::vector<Span> spans_;
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_PARALLEL_GRAD_BUCKETS_H_
