#include "worker/train/parallel/grad_buckets.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "worker/train/error.h"

namespace loom::train {

std::vector<GradBucketPlan> PlanGradBuckets(const std::vector<TensorInfo>& table, int layers,
                                            size_t bucket_bytes, size_t bytes_per_element) {
  LOOM_CHECK(bytes_per_element > 0, "gradient elements of zero bytes");
  LOOM_CHECK(bucket_bytes >= bytes_per_element, "bucket size below one element");
  // The pieces, by stage: lnf (stage L), each block's slices (stage l), embeddings (stage -1).
  std::vector<GradPiece> pieces;
  auto tensor = [&](const char* name) -> const TensorInfo& {
    for (const TensorInfo& t : table) {
      if (t.name == name) return t;
    }
    LOOM_CHECK(false, std::string("parameter table lacks ") + name);
    return table.front();
  };
  // This stage's blocks [first, first + nblocks) (a pipeline stage holds a contiguous range;
  // the stacked tensors' leading dimension), and which ends of the model it holds.
  const TensorInfo& ln1w = tensor("ln1w");
  const int first = ln1w.box_start.empty() ? 0 : static_cast<int>(ln1w.box_start[0]);
  const int nblocks = ln1w.shape.empty() ? layers : static_cast<int>(ln1w.shape[0]);
  const bool has_head = tensor("lnfw").numel > 0;
  const bool has_embeddings = tensor("wpe").numel > 0;
  for (const char* name : {"lnfb", "lnfw"}) {
    const TensorInfo& t = tensor(name);
    if (t.numel > 0) pieces.push_back({t.offset, t.numel, layers});
  }
  // The last stage's copy of the tied wte, when it is not also the first stage, is final
  // after the head (stage L).
  if (has_head && !has_embeddings && tensor("wte").numel > 0) {
    const TensorInfo& t = tensor("wte");
    pieces.push_back({t.offset, t.numel, layers});
  }
  // Within a block, the order backward writes them (MLP first, then attention).
  const char* block[] = {"fcprojb",  "fcprojw",  "fcb",  "fcw",  "ln2b", "ln2w",
                         "attprojb", "attprojw", "qkvb", "qkvw", "ln1b", "ln1w"};
  for (int i = nblocks - 1; i >= 0; --i) {
    for (const char* name : block) {
      const TensorInfo& t = tensor(name);
      const size_t per_layer = t.numel / static_cast<size_t>(nblocks);
      pieces.push_back({t.offset + per_layer * i, per_layer, first + i});
    }
  }
  if (has_embeddings) {
    for (const char* name : {"wpe", "wte"}) {
      const TensorInfo& t = tensor(name);
      pieces.push_back({t.offset, t.numel, -1});
    }
  }

  std::vector<GradBucketPlan> buckets;
  const size_t cap = bucket_bytes / bytes_per_element;
  size_t total = 0;
  for (const GradPiece& p : pieces) {
    if (buckets.empty() || (buckets.back().numel > 0 && buckets.back().numel + p.numel > cap)) {
      buckets.emplace_back();
    }
    GradBucketPlan& b = buckets.back();
    b.pieces.push_back(p);
    b.last_stage = p.stage;  // stages only go down along `pieces`
    b.numel += p.numel;
    total += p.numel;
  }
  LOOM_CHECK(total == ParamCount(table), "buckets do not cover the gradients once");
  return buckets;
}

std::vector<GradBucketPlan> ToPaddedLayout(const std::vector<GradBucketPlan>& buckets,
                                           const std::vector<TensorInfo>& table,
                                           const PaddedLayout& layout) {
  LOOM_CHECK(layout.offset.size() == table.size() && layout.numel.size() == table.size(),
             "the padded layout is not the table's");
  std::vector<GradBucketPlan> out = buckets;
  size_t total = 0;
  for (GradBucketPlan& b : out) {
    b.numel = 0;
    for (GradPiece& p : b.pieces) {
      // The tensor holding the piece (the table's tensors are disjoint and sorted by offset).
      size_t i = 0;
      while (i < table.size() && !(table[i].numel > 0 && p.offset >= table[i].offset &&
                                   p.offset + p.numel <= table[i].offset + table[i].numel)) {
        ++i;
      }
      LOOM_CHECK(i < table.size(), "a gradient piece outside every tensor");
      if (layout.numel[i] != table[i].numel) {
        // wte: its padding rows follow its V rows, so only the whole tensor maps to one run.
        LOOM_CHECK(p.offset == table[i].offset && p.numel == table[i].numel,
                   "a piece of a padded tensor must be the whole tensor");
        p.numel = layout.numel[i];
      }
      p.offset = layout.offset[i] + (p.offset - table[i].offset);
      b.numel += p.numel;
    }
    total += b.numel;
  }
  LOOM_CHECK(total == layout.total, "padded buckets do not cover the device buffer once");
  return out;
}

GradBuckets::GradBuckets(const std::vector<TensorInfo>& table, int layers, size_t bucket_bytes,
                         Communicator* comm)
    : comm_(comm) {
  LOOM_CHECK(comm != nullptr, "GradBuckets needs a communicator");
  LOOM_CHECK(bucket_bytes >= sizeof(float), "bucket size below one float");
  for (GradBucketPlan& plan : PlanGradBuckets(table, layers, bucket_bytes, sizeof(float))) {
    Bucket& b = buckets_.emplace_back();
    b.pieces = std::move(plan.pieces);
    b.last_stage = plan.last_stage;
    b.buffer.assign(plan.numel, 0.0f);
    total_floats_ += plan.numel;
  }
}

void GradBuckets::Begin(float* grads) {
  LOOM_CHECK(next_ == 0 || next_ == buckets_.size(), "Begin while a step is being reduced");
  grads_ = grads;
  next_ = 0;
  for (Bucket& b : buckets_) {
    b.work.reset();
    b.done = {};
  }
}

void GradBuckets::Launch(Bucket& b) {
  float* dst = b.buffer.data();
  for (const GradPiece& p : b.pieces) {
    std::copy_n(grads_ + p.offset, p.numel, dst);
    dst += p.numel;
  }
  b.launched = std::chrono::steady_clock::now();
  b.work = comm_->AllReduceSum(b.buffer.data(), b.buffer.size());
}

void GradBuckets::Poll() {
  const auto now = std::chrono::steady_clock::now();
  for (size_t i = 0; i < next_; ++i) {
    Bucket& b = buckets_[i];
    if (b.done == std::chrono::steady_clock::time_point{} && b.work->Done()) b.done = now;
  }
}

void GradBuckets::StageReady(int stage) {
  LOOM_CHECK(grads_ != nullptr, "StageReady before Begin");
  while (next_ < buckets_.size() && buckets_[next_].last_stage >= stage) {
    Launch(buckets_[next_++]);
  }
  Poll();
}

double GradBuckets::Finish() {
  StageReady(-1);  // a backward without the hook (or an early stop) still reduces everything
  const float scale = 1.0f / static_cast<float>(comm_->size());
  double waited = 0.0;
  comm_seconds_ = 0.0;
  spans_.clear();
  std::chrono::steady_clock::time_point previous_done{};
  for (Bucket& b : buckets_) {
    auto start = std::chrono::steady_clock::now();
    b.work->Wait();
    const auto end = std::chrono::steady_clock::now();
    waited += std::chrono::duration<double>(end - start).count();
    if (b.done == std::chrono::steady_clock::time_point{}) b.done = end;
    // The communication thread runs the buckets in launch order: this one started when it was
    // launched or when the one before finished, whichever was later.
    const auto began = std::max(b.launched, previous_done);
    if (b.done > began) comm_seconds_ += std::chrono::duration<double>(b.done - began).count();
    spans_.push_back({began, std::max(began, b.done), b.buffer.size() * sizeof(float)});
    previous_done = b.done;
    const float* src = b.buffer.data();
    for (const GradPiece& p : b.pieces) {
      float* g = grads_ + p.offset;
      for (size_t i = 0; i < p.numel; ++i) g[i] = src[i] * scale;
      src += p.numel;
    }
  }
  grads_ = nullptr;
  return waited;
}

}  // namespace loom::train
