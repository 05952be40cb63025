#include "worker/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "kernels/grad_norm.h"
#include "worker/train/error.h"

namespace loom::train {
namespace {

AdamWConfig AdamFrom(const JobConfig& c) {
  AdamWConfig a;
  a.weight_decay = static_cast<float>(c.weight_decay);
  return a;
}

LrSchedule ScheduleFrom(const JobConfig& c) {
  return LrSchedule{c.lr, c.warmup_steps, c.steps, c.min_lr_ratio};
}

// A hand-built shape without stage bounds is one stage holding every block.
BatchShape Resolved(BatchShape shape, const JobConfig& config) {
  if (shape.stage_bounds.empty()) shape.stage_bounds = {0, config.model.layers};
  LOOM_CHECK(static_cast<int>(shape.stage_bounds.size()) == shape.pp_size + 1 &&
                 shape.stage_bounds.front() == 0 &&
                 shape.stage_bounds.back() == config.model.layers,
             "the batch shape's stage bounds do not cover the model's blocks");
  return shape;
}

ModelShard ShardOf(const BatchShape& s) {
  return ModelShard{s.tp_size, s.tp_rank, s.first_block(), s.last_block()};
}

bool Alone(const Communicator* c) { return c == nullptr || c->size() == 1; }

void CheckGroup(const Communicator* c, int size, int rank, const char* what) {
  if (c == nullptr) {
    LOOM_CHECK(size == 1,
               std::string("no ") + what + " communicator for a group of " + std::to_string(size));
    return;
  }
  LOOM_CHECK(c->size() == size && c->rank() == rank,
             std::string("the ") + what + " communicator does not match the batch shape");
}

// Point-to-point tags on the pp group: the micro-batch and what travels.
enum Direction : uint32_t { kActivation = 0, kGradient = 1, kEvalActivation = 2 };
uint32_t Tag(int micro, Direction d) { return static_cast<uint32_t>(micro) * 4u + d; }

}  // namespace

Trainer::Trainer(const JobConfig& config, const BatchShape& shape, const Dataset& data,
                 Communicator* dp, size_t bucket_bytes)
    : Trainer(config, shape, data, TrainerComms{dp, dp, nullptr, nullptr, nullptr},
              TrainerOptions{bucket_bytes, true}) {}

Trainer::Trainer(const JobConfig& config, const BatchShape& shape, const Dataset& data,
                 const TrainerComms& comms, const TrainerOptions& options)
    : config_(config),
      shape_(Resolved(shape, config)),
      data_(data),
      comms_(comms),
      options_(options),
      model_(config.model, ShardOf(shape_), shape_.tp_size > 1 ? comms.tp : nullptr),
      optimizer_(model_.num_params(), AdamFrom(config),
                 shape_.zero1 && !Alone(comms.dp)
                     ? ZeroRangeOf(model_.num_params(), comms.dp->size(), comms.dp->rank()).begin
                     : 0,
                 shape_.zero1 && !Alone(comms.dp)
                     ? ZeroRangeOf(model_.num_params(), comms.dp->size(), comms.dp->rank()).end
                     : model_.num_params()),
      schedule_(ScheduleFrom(config)),
      sampler_(data.train(), config.seed, shape.B, shape.T, shape.K, shape.dp_rank),
      eval_batches_(data.val(), shape.B, shape.T, kMaxEvalBatches) {
  CheckGroup(comms_.dp, shape_.dp_size, shape_.dp_rank, "data-parallel");
  CheckGroup(comms_.tp, shape_.tp_size, shape_.tp_rank, "tensor-parallel");
  CheckGroup(comms_.pp, shape_.pp_size, shape_.pp_rank, "pipeline");
  if (shape_.pp_size > 1 && (first_stage() || last_stage())) {
    CheckGroup(comms_.emb, 2, first_stage() ? 0 : 1, "embedding");
  }
  const int world = shape_.dp_size * shape_.tp_size * shape_.pp_size;
  LOOM_CHECK(comms_.world != nullptr ? comms_.world->size() == world : world == 1,
             "the world communicator does not match the layout");
  model_.InitWeights(config.seed);
  model_.set_trace(options_.trace);
  if (!Alone(comms_.dp)) {
    // ZeRO-1 reduce-scatters the gradients once after backward instead of all-reducing them in
    // buckets (parallel/zero_optimizer.h).
    if (shape_.zero1) {
      zero_ = std::make_unique<RangeGather>(model_.num_params(), comms_.dp);
    } else {
      buckets_ = std::make_unique<GradBuckets>(model_.tensors(), config.model.layers,
                                               options.bucket_bytes, comms_.dp);
    }
  }
  ops_ =
      StageSchedule(ParsePipelineKind(shape_.schedule), shape_.pp_size, shape_.pp_rank, shape_.K);
  slots_ = SlotsNeeded(ops_);
  model_.Reserve(shape_.B, shape_.T, slots_);
  const size_t bt = static_cast<size_t>(shape_.B) * shape_.T;
  const size_t btc = bt * static_cast<size_t>(config.model.channels);
  inputs_.assign(slots_, std::vector<int>(bt));
  targets_.assign(slots_, std::vector<int>(bt));
  if (shape_.pp_size > 1) {
    if (!first_stage()) act_in_.assign(slots_, std::vector<float>(btc));
    if (!last_stage()) grad_in_.assign(slots_, std::vector<float>(btc));
    if (!last_stage()) act_out_.assign(slots_, std::vector<float>(btc));
    if (!first_stage()) grad_out_.assign(slots_, std::vector<float>(btc));
    act_sends_.assign(slots_, nullptr);
    grad_sends_.assign(slots_, nullptr);
  }
}

double Trainer::RunSchedule(CommBytes* bytes) {
  const int B = shape_.B, T = shape_.T, K = shape_.K;
  const size_t btc = static_cast<size_t>(B) * T * config_.model.channels;
  const bool first = first_stage(), last = last_stage();
  double loss_sum = 0.0;
  for (const PipeOp& op : ops_) {
    const int m = op.micro;
    const int slot = m % slots_;
    if (options_.trace) options_.trace->set_micro(m);
    if (op.kind == PipeOp::kForward) {
      profiler_.Enter(Phase::kData);
      int64_t t = TraceStart();
      // Every stage draws the same micro-batch (a pure function of the step): the first needs
      // its tokens, the last its targets.
      sampler_.Fill(step_, m, inputs_[slot].data(), targets_[slot].data());
      Trace(TraceKind::kData, t, m);
      const float* input = nullptr;
      if (!first) {
        profiler_.Enter(Phase::kBubble);
        t = TraceStart();
        comms_.pp->Recv(act_in_[slot].data(), btc, shape_.pp_rank - 1, Tag(m, kActivation))->Wait();
        Trace(TraceKind::kPpRecvActivation, t, m, btc * sizeof(float), shape_.pp_rank - 1);
        bytes->pp_send_recv += btc * sizeof(float);
        input = act_in_[slot].data();
      }
      if (!last && act_sends_[slot]) {
        // The slot's previous activations must have left before they are overwritten.
        profiler_.Enter(Phase::kBubble);
        t = TraceStart();
        act_sends_[slot]->Wait();
        Trace(TraceKind::kPpSendWait, t, m, 0, shape_.pp_rank + 1);
      }
      profiler_.Enter(Phase::kForward);
      t = TraceStart();
      if (options_.test_forward_sleep_ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(options_.test_forward_sleep_ms));
      }
      const float loss = model_.ForwardMicro(slot, inputs_[slot].data(), input,
                                             last ? targets_[slot].data() : nullptr);
      if (last) loss_sum += loss;
      if (!last) {
        std::memcpy(act_out_[slot].data(), model_.Output(slot), btc * sizeof(float));
        act_sends_[slot] =
            comms_.pp->Send(act_out_[slot].data(), btc, shape_.pp_rank + 1, Tag(m, kActivation));
        bytes->pp_send_recv += btc * sizeof(float);
      }
      // aux: the stage; bytes: the activations sent on (0 on the last stage).
      Trace(TraceKind::kForward, t, m, last ? 0 : btc * sizeof(float), shape_.pp_rank);
    } else {
      const float* doutput = nullptr;
      int64_t t = 0;
      if (!last) {
        profiler_.Enter(Phase::kBubble);
        t = TraceStart();
        comms_.pp->Recv(grad_in_[slot].data(), btc, shape_.pp_rank + 1, Tag(m, kGradient))->Wait();
        Trace(TraceKind::kPpRecvGradient, t, m, btc * sizeof(float), shape_.pp_rank + 1);
        bytes->pp_send_recv += btc * sizeof(float);
        doutput = grad_in_[slot].data();
      }
      profiler_.Enter(Phase::kBackward);
      t = TraceStart();
      // The step's loss is the mean over its K micro-batches. Only the last micro-batch's
      // backward launches buckets: accumulation communicates once per step.
      GPT::GradReadyFn ready;
      if (buckets_ && options_.dp_overlap && m == K - 1) {
        ready = [this](int stage) { buckets_->StageReady(stage); };
      }
      model_.BackwardMicro(slot, 1.0f / static_cast<float>(K), doutput, ready);
      // aux: the stage; bytes: the input gradient sent back (0 on the first stage).
      Trace(TraceKind::kBackward, t, m, first ? 0 : btc * sizeof(float), shape_.pp_rank);
      if (!first) {
        if (grad_sends_[slot]) {
          profiler_.Enter(Phase::kBubble);
          t = TraceStart();
          grad_sends_[slot]->Wait();
          Trace(TraceKind::kPpSendWait, t, m, 0, shape_.pp_rank - 1);
          profiler_.Enter(Phase::kBackward);
        }
        std::memcpy(grad_out_[slot].data(), model_.InputGrad(), btc * sizeof(float));
        grad_sends_[slot] =
            comms_.pp->Send(grad_out_[slot].data(), btc, shape_.pp_rank - 1, Tag(m, kGradient));
        bytes->pp_send_recv += btc * sizeof(float);
      }
    }
  }
  if (options_.trace) options_.trace->set_micro(-1);
  profiler_.Enter(Phase::kBubble);
  const int64_t drain = TraceStart();
  WaitSends();
  if (shape_.pp_size > 1) Trace(TraceKind::kPpSendWait, drain);
  if (shape_.tp_size > 1) {
    // Two all-reduces of (B, T, C) per block in each direction per micro-batch (gpt.h).
    const size_t blocks = static_cast<size_t>(shape_.last_block() - shape_.first_block());
    bytes->tp_all_reduce = blocks * static_cast<size_t>(K) * 4 * btc * sizeof(float);
  }
  return loss_sum;
}

void Trainer::WaitSends() {
  for (std::vector<WorkHandle>* sends : {&act_sends_, &grad_sends_}) {
    for (WorkHandle& w : *sends) {
      if (w) w->Wait();
      w.reset();
    }
  }
}

StepResult Trainer::Step() {
  const int B = shape_.B, T = shape_.T, K = shape_.K;
  StepResult r;
  const bool sample = block_sample_every_ > 0 && (step_ + 1) % block_sample_every_ == 0;
  if (sample) {
    block_costs_.Reset(model_.shard().first_block,
                       model_.shard().last_block - model_.shard().first_block);
    model_.set_block_costs(&block_costs_);
  }
  profiler_.BeginStep();
  const int64_t step_start = options_.trace ? options_.trace->BeginStep(step_ + 1) : 0;
  model_.ZeroGrad();
  if (buckets_) buckets_->Begin(model_.grads());
  const double loss_sum = RunSchedule(&r.comm);
  if (!Alone(comms_.pp)) {
    // The pipeline drains: a stage that finished its ops waits for the others here, which is
    // bubble (otherwise it would show as waiting on the step's later collectives).
    profiler_.Enter(Phase::kBubble);
    const int64_t t = TraceStart();
    comms_.pp->Barrier()->Wait();
    Trace(TraceKind::kPipelineDrain, t);
  }
  float loss = static_cast<float>(loss_sum / K);
  const bool alone = Alone(comms_.world);
  double bucket_wait = 0.0;  // seconds waited on the gradient buckets after backward
  if (buckets_) {
    profiler_.Enter(Phase::kCommExposed);
    const int64_t t = TraceStart();
    bucket_wait = buckets_->Finish();
    r.dp_comm_seconds = buckets_->comm_seconds();
    r.comm.dp_all_reduce = buckets_->bytes_per_step();
    Trace(TraceKind::kDpWait, t, -1, r.comm.dp_all_reduce);
    if (options_.trace) {
      // The buckets ran on the communication thread while backward went on: their own records.
      const std::vector<GradBuckets::Span>& spans = buckets_->spans();
      for (size_t i = 0; i < spans.size(); ++i) {
        options_.trace->Record(TraceKind::kDpBucketAllReduce, TraceRecorder::Nanos(spans[i].began),
                               TraceRecorder::Nanos(spans[i].done), -1, spans[i].bytes,
                               static_cast<int32_t>(i));
      }
    }
  }
  const std::vector<TensorInfo>& table = model_.tensors();
  if (comms_.emb != nullptr) {
    // The tied embedding: the first stage's wte gradient (the encoder) plus the last stage's
    // (the head) is the whole model's.
    profiler_.Enter(Phase::kCommExposed);
    const TensorInfo& wte = table[0];
    LOOM_CHECK(wte.name == "wte" && wte.numel > 0, "an embedding-group rank without wte");
    const int64_t t = TraceStart();
    comms_.emb->AllReduceSum(model_.grads() + wte.offset, wte.numel)->Wait();
    r.comm.emb_all_reduce = wte.numel * sizeof(float);
    Trace(TraceKind::kEmbAllReduce, t, -1, r.comm.emb_all_reduce);
  }
  if (zero_) {
    // ZeRO-1: this rank's range of the dp mean. Both sums are linear, so the embedding group's
    // sum above (of the whole wte, before the dp sum) gives the same total as the other order;
    // it cannot come after, on the range, because the first and the last stage's ranges cover
    // different parts of wte. The bytes count as "all_reduce", the dp gradient kind that loomd
    // knows (server/metrics), at the padded input's size, as the all-reduce would be.
    profiler_.Enter(Phase::kCommExposed);
    const auto start = std::chrono::steady_clock::now();
    const int64_t t = TraceStart();
    zero_->ReduceScatter(model_.grads(), 1.0f / static_cast<float>(shape_.dp_size));
    // All of it exposed: no buckets, so the overlap ratio stays 0.
    r.dp_comm_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.comm.dp_all_reduce = zero_->reduce_scatter_bytes();
    Trace(TraceKind::kZeroReduceScatter, t, -1, r.comm.dp_all_reduce);
  }
  // The part of the gradients this rank reduced and updates: its ZeRO-1 range or everything.
  const size_t begin = optimizer_.begin(), end = optimizer_.end();
  profiler_.Enter(Phase::kOptimizer);
  const int64_t optimizer_start = TraceStart();
  const bool stop_here = options_.stop_requested && options_.stop_requested();
  if (alone) {
    r.grad_norm = GradNorm(model_.grads(), table);
    r.stop_requested = stop_here;
  } else {
    // One world all-reduce carries the loss (from the last stage's tensor rank 0, averaged over
    // dp) and the squared gradient norm (each tensor once: its owners, on dp rank 0, or under
    // ZeRO-1 on every dp rank for the part of them inside its range; the ranges tile the buffer).
    double sumsq = 0.0;
    if (zero_ || shape_.dp_rank == 0) {
      for (const TensorInfo& t : table) {
        if (t.numel == 0 || !t.owner) continue;
        const size_t lo = std::max(t.offset, begin), hi = std::min(t.offset + t.numel, end);
        if (lo >= hi) continue;
        sumsq +=
            loom::kernels::cpu::sum_of_squares(model_.grads() + lo, static_cast<long>(hi - lo));
      }
    }
    // The third value counts the ranks asked to stop: the gang agrees on this step to save at.
    float shared[3] = {
        last_stage() && shape_.tp_rank == 0 ? loss / static_cast<float>(shape_.dp_size) : 0.0f,
        static_cast<float>(sumsq), stop_here ? 1.0f : 0.0f};
    profiler_.Enter(Phase::kCommExposed);
    const int64_t t = TraceStart();
    comms_.world->AllReduceSum(shared, 3)->Wait();
    r.comm.world_all_reduce = sizeof(shared);
    Trace(TraceKind::kWorldAllReduce, t, -1, sizeof(shared));
    profiler_.Enter(Phase::kOptimizer);
    loss = shared[0];
    r.grad_norm = std::sqrt(static_cast<double>(std::max(shared[1], 0.0f)));
    r.stop_requested = shared[2] > 0.5f;
  }
  if (!std::isfinite(loss)) {
    throw BadInput("train.lr", "the loss became " + std::to_string(loss) + " at step " +
                                   std::to_string(step_ + 1) +
                                   ": training diverged (lower the learning rate)");
  }
  ClipGradients(model_.grads() + begin, end - begin, r.grad_norm, config_.grad_clip);
  r.lr = LearningRate(schedule_, step_);
  optimizer_.Update(model_.params(), model_.grads(), table, static_cast<float>(r.lr));
  // The world all-reduce above is a record nested inside this one.
  Trace(TraceKind::kOptimizer, optimizer_start);
  if (zero_) {
    // Every dp rank updated its range; everyone needs every range.
    profiler_.Enter(Phase::kCommExposed);
    const int64_t t = TraceStart();
    zero_->Gather(model_.params() + optimizer_.begin(), model_.params());
    r.comm.all_gather = zero_->bytes_per_call();
    Trace(TraceKind::kZeroAllGather, t, -1, r.comm.all_gather);
  }
  ++step_;
  r.times = profiler_.EndStep(int64_t{B} * T * K);  // this rank's tokens, as before
  Trace(TraceKind::kStep, step_start);
  if (sample) {
    model_.set_block_costs(nullptr);
    r.has_block_costs = true;
    r.block_costs = block_costs_;
  }
  r.step = step_;
  r.loss = loss;
  r.allreduce_bytes = r.comm.dp_all_reduce;
  const double step_s = r.times.step_seconds;
  const double exposed = r.times.phase(Phase::kCommExposed);
  const double bubble = r.times.phase(Phase::kBubble);
  if (buckets_ && r.dp_comm_seconds > 0.0) {
    r.overlap_ratio = std::clamp(1.0 - bucket_wait / r.dp_comm_seconds, 0.0, 1.0);
  }
  if (step_s > 0.0) {
    r.bubble_ratio = shape_.pp_size > 1 ? bubble / step_s : 0.0;
    r.idle_ratio = (exposed + bubble) / step_s;
  }
  memory_.Record(bytes_allocated());
  r.memory_bytes = memory_.in_use();
  r.peak_memory_bytes = memory_.peak();
  r.rss_bytes = ResidentSetBytes();
  // No caching allocator on the CPU: everything held is in use, nothing is fragmented and no
  // device memory is taken (memory_fragmentation, device_allocations stay 0; device "cpu").
  r.reserved_memory_bytes = r.memory_bytes;
  return r;
}

float Trainer::Evaluate() {
  const size_t btc = static_cast<size_t>(shape_.B) * shape_.T * config_.model.channels;
  const bool first = first_stage(), last = last_stage();
  if (act_in_.empty() && !first) act_in_.assign(1, std::vector<float>(btc));
  // Evaluation is not on the timeline: its tensor-parallel all-reduces would land in the last
  // training step's records.
  model_.set_trace(nullptr);
  double sum = 0.0;
  for (int i = 0; i < eval_batches_.num_batches(); ++i) {
    eval_batches_.Fill(i, inputs_[0].data(), targets_[0].data());
    const float* input = nullptr;
    if (!first) {
      comms_.pp->Recv(act_in_[0].data(), btc, shape_.pp_rank - 1, Tag(i, kEvalActivation))->Wait();
      input = act_in_[0].data();
    }
    const float loss =
        model_.ForwardMicro(0, inputs_[0].data(), input, last ? targets_[0].data() : nullptr);
    if (last) sum += loss;
    if (!last) {
      // Slot 0 is overwritten by the next batch: the send must be done first.
      comms_.pp->Send(model_.Output(0), btc, shape_.pp_rank + 1, Tag(i, kEvalActivation))->Wait();
    }
  }
  float mean = static_cast<float>(sum / eval_batches_.num_batches());
  if (!Alone(comms_.world)) {
    // Every dp rank evaluated the same batches: one copy (dp 0, tp 0 of the last stage) counts.
    float shared = last && shape_.tp_rank == 0 && shape_.dp_rank == 0 ? mean : 0.0f;
    comms_.world->AllReduceSum(&shared, 1)->Wait();
    mean = shared;
  }
  model_.set_trace(options_.trace);
  return mean;
}

void Trainer::GatherMoments(std::vector<float>* m, std::vector<float>* v) {
  m->assign(model_.num_params(), 0.0f);
  v->assign(model_.num_params(), 0.0f);
  zero_->Gather(optimizer_.m(), m->data());
  zero_->Gather(optimizer_.v(), v->data());
}

std::string Trainer::Save(const std::string& root, int64_t generation) {
  CheckpointMeta meta = MetaOf(shape_, model_.dims(), config_.seed, step_, generation);
  meta.zero1 = zero_ != nullptr;
  meta.optimizer_step = optimizer_.step();
  if (Alone(comms_.world)) return SaveCheckpoint(root, model_, optimizer_, meta);

  // Under ZeRO-1 every dp rank holds a range of the moments: gather them (a dp collective, so
  // every dp rank takes part) for the writer.
  std::vector<float> m_full, v_full;
  const float* m = optimizer_.m();
  const float* v = optimizer_.v();
  if (zero_) {
    GatherMoments(&m_full, &v_full);
    m = m_full.data();
    v = v_full.data();
  }
  for (int p = 0; p < shape_.pp_size; ++p) {
    for (int t = 0; t < shape_.tp_size; ++t) meta.shards.push_back(ShardName(p, t));
  }
  std::string staging;
  if (shape_.dp_rank == 0) {
    staging = StageCheckpoint(root, step_, generation);
    WriteShard(staging, ShardName(shape_.pp_rank, shape_.tp_rank), model_.tensors(),
               model_.params(), m, v);
  }
  comms_.world->Barrier()->Wait();
  std::string dir = root + "/" + CheckpointDirName(step_);
  if (comms_.world->rank() == 0) {
    try {
      dir = CommitCheckpoint(root, staging, meta);
    } catch (const IoError& e) {
      // The usual cause under loom-worker: the default checkpoint directory is private to each
      // node, so rank 0 cannot see the other nodes' shards.
      throw IoError(std::string(e.what()) +
                    " (every writing rank must see the checkpoint directory: set checkpoint.dir "
                    "to a shared file system when the ranks run on several nodes)");
    }
  }
  // Nobody goes on (or reads the checkpoint) before it is published.
  comms_.world->Barrier()->Wait();
  return dir;
}

CheckpointMeta Trainer::Resume(const std::string& dir) {
  const size_t n = model_.num_params();
  std::vector<float> m_full, v_full;
  float* m = optimizer_.m();
  float* v = optimizer_.v();
  if (zero_) {
    m_full.assign(n, 0.0f);
    v_full.assign(n, 0.0f);
    m = m_full.data();
    v = v_full.data();
  }
  CheckpointMeta meta =
      LoadShardedCheckpoint(dir, model_.dims(), model_.tensors(), model_.params(), m, v);
  if (zero_) {
    // Keep this dp rank's range of the moments.
    const size_t b = optimizer_.begin(), e = optimizer_.end();
    std::copy(m_full.begin() + b, m_full.begin() + e, optimizer_.m());
    std::copy(v_full.begin() + b, v_full.begin() + e, optimizer_.v());
  }
  optimizer_.set_step(meta.optimizer_step >= 0 ? meta.optimizer_step : meta.step);
  step_ = meta.step;
  return meta;
}

size_t Trainer::bytes_allocated() const {
  size_t buffers = 0;
  for (const auto* v : {&act_in_, &grad_in_, &act_out_, &grad_out_}) {
    for (const std::vector<float>& b : *v) buffers += b.capacity() * sizeof(float);
  }
  for (const auto* v : {&inputs_, &targets_}) {
    for (const std::vector<int>& b : *v) buffers += b.capacity() * sizeof(int);
  }
  return model_.bytes_allocated() + optimizer_.bytes_allocated() + data_.bytes_owned() + buffers;
}

}  // namespace loom::train
