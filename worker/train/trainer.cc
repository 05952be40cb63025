#include "worker/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "worker/train/cpu_backend.h"
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
              TrainerOptions{bucket_bytes, true, nullptr}) {}

Trainer::Trainer(const JobConfig& config, const BatchShape& shape, const Dataset& data,
                 const TrainerComms& comms, const TrainerOptions& options)
    : Trainer(
          config, shape, data, comms, options,
          std::make_unique<CpuBackend>(config.model, ShardOf(Resolved(shape, config)), config.seed,
                                       CpuBackendOptions{AdamFrom(config), comms.tp, comms.dp,
                                                         shape.zero1, options.bucket_bytes})) {}

Trainer::Trainer(const JobConfig& config, const BatchShape& shape, const Dataset& data,
                 const TrainerComms& comms, const TrainerOptions& options,
                 std::unique_ptr<Backend> backend)
    : config_(config),
      shape_(Resolved(shape, config)),
      data_(data),
      comms_(comms),
      options_(options),
      backend_(std::move(backend)),
      schedule_(ScheduleFrom(config)),
      sampler_(data.train(), config.seed, shape.B, shape.T, shape.K, shape.dp_rank),
      eval_batches_(data.val(), shape.B, shape.T, kMaxEvalBatches) {
  CheckGroup(comms_.dp, shape_.dp_size, shape_.dp_rank, "data-parallel");
  CheckGroup(comms_.tp, shape_.tp_size, shape_.tp_rank, "tensor-parallel");
  CheckGroup(comms_.pp, shape_.pp_size, shape_.pp_rank, "pipeline");
  if (comms_.pp_grad != nullptr) {
    CheckGroup(comms_.pp_grad, shape_.pp_size, shape_.pp_rank, "pipeline gradient");
  }
  if (shape_.pp_size > 1 && (first_stage() || last_stage())) {
    CheckGroup(comms_.emb, 2, first_stage() ? 0 : 1, "embedding");
  }
  const int world = shape_.dp_size * shape_.tp_size * shape_.pp_size;
  LOOM_CHECK(comms_.world != nullptr ? comms_.world->size() == world : world == 1,
             "the world communicator does not match the layout");
  LOOM_CHECK(backend_ != nullptr, "a trainer without a backend");
  const ModelShard want = ShardOf(shape_);
  const ModelShard& have = backend_->shard();
  LOOM_CHECK(have.tp_size == want.tp_size && have.tp_rank == want.tp_rank &&
                 have.first_block == want.first_block && have.last_block == want.last_block,
             "the backend holds another shard than the batch shape's");
  backend_->set_trace(options_.trace);
  ops_ =
      StageSchedule(ParsePipelineKind(shape_.schedule), shape_.pp_size, shape_.pp_rank, shape_.K);
  slots_ = SlotsNeeded(ops_);
  backend_->Reserve(shape_.B, shape_.T, slots_);
  const size_t bt = static_cast<size_t>(shape_.B) * shape_.T;
  inputs_.assign(slots_, std::vector<int>(bt));
  targets_.assign(slots_, std::vector<int>(bt));
  if (shape_.pp_size > 1) {
    auto buffers = [this](std::vector<void*>* v) {
      for (int i = 0; i < slots_; ++i) v->push_back(backend_->NewStageBuffer());
    };
    if (!first_stage()) buffers(&act_in_);
    if (!last_stage()) buffers(&grad_in_);
    if (!last_stage()) buffers(&act_out_);
    if (!first_stage()) buffers(&grad_out_);
    act_sends_.assign(slots_, nullptr);
    grad_sends_.assign(slots_, nullptr);
  }
}

bool Trainer::zero1() const { return shape_.zero1 && !Alone(comms_.dp); }

CpuBackend* Trainer::cpu() { return dynamic_cast<CpuBackend*>(backend_.get()); }

GPT& Trainer::model() {
  CpuBackend* c = cpu();
  LOOM_CHECK(c != nullptr, "the CPU model of a trainer on " + backend_->device_name());
  return c->model();
}

const GPT& Trainer::model() const { return const_cast<Trainer*>(this)->model(); }

size_t Trainer::num_buckets() const {
  GradSync* sync = const_cast<Backend&>(*backend_).grad_sync();
  return sync != nullptr ? sync->num_buckets() : 0;
}

double Trainer::RunSchedule(CommBytes* bytes) {
  const int K = shape_.K;
  // A stage buffer: (B, T, C) in the backend's activation type, moved as `words` fp32 words.
  const size_t words = backend_->stage_floats(), wire = backend_->stage_bytes();
  const bool first = first_stage(), last = last_stage();
  std::vector<float> losses(K, 0.0f);  // (K) each micro-batch's mean loss (last stage)
  for (const PipeOp& op : ops_) {
    const int m = op.micro;
    const int slot = m % slots_;
    if (options_.trace) options_.trace->set_micro(m);
    if (op.kind == PipeOp::kForward) {
      backend_->Enter(Phase::kData);
      int64_t t = TraceStart();
      // Every stage draws the same micro-batch (a pure function of the step): the first needs
      // its tokens, the last its targets.
      sampler_.Fill(step_, m, inputs_[slot].data(), targets_[slot].data());
      Trace(TraceKind::kData, t, m);
      const void* input = nullptr;
      if (!first) {
        backend_->Enter(Phase::kBubble);
        t = TraceStart();
        comms_.pp
            ->Recv(static_cast<float*>(act_in_[slot]), words, shape_.pp_rank - 1,
                   Tag(m, kActivation))
            ->Wait();
        Trace(TraceKind::kPpRecvActivation, t, m, wire, shape_.pp_rank - 1);
        bytes->pp_send_recv += wire;
        input = act_in_[slot];
      }
      if (!last && act_sends_[slot]) {
        // The slot's previous activations must have left before they are overwritten.
        backend_->Enter(Phase::kBubble);
        t = TraceStart();
        act_sends_[slot]->Wait();
        Trace(TraceKind::kPpSendWait, t, m, 0, shape_.pp_rank + 1);
      }
      backend_->Enter(Phase::kForward);
      t = TraceStart();
      if (options_.test_forward_sleep_ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(options_.test_forward_sleep_ms));
      }
      backend_->ForwardMicro(slot, inputs_[slot].data(), input,
                             last ? targets_[slot].data() : nullptr);
      if (!last) {
        backend_->CopyStage(act_out_[slot], backend_->Output(slot));
        act_sends_[slot] = comms_.pp->Send(static_cast<const float*>(act_out_[slot]), words,
                                           shape_.pp_rank + 1, Tag(m, kActivation));
        bytes->pp_send_recv += wire;
      }
      // aux: the stage; bytes: the activations sent on (0 on the last stage).
      Trace(TraceKind::kForward, t, m, last ? 0 : wire, shape_.pp_rank);
    } else {
      const void* doutput = nullptr;
      int64_t t = 0;
      if (!last) {
        backend_->Enter(Phase::kBubble);
        t = TraceStart();
        grad_comm()
            ->Recv(static_cast<float*>(grad_in_[slot]), words, shape_.pp_rank + 1,
                   Tag(m, kGradient))
            ->Wait();
        Trace(TraceKind::kPpRecvGradient, t, m, wire, shape_.pp_rank + 1);
        bytes->pp_send_recv += wire;
        doutput = grad_in_[slot];
      }
      backend_->Enter(Phase::kBackward);
      t = TraceStart();
      // The step's loss is the mean over its K micro-batches. Only the last micro-batch's
      // backward launches buckets: accumulation communicates once per step.
      Backend::GradReadyFn ready;
      GradSync* sync = backend_->grad_sync();
      if (sync != nullptr && options_.dp_overlap && m == K - 1) {
        ready = [sync](int stage) { sync->StageReady(stage); };
      }
      backend_->BackwardMicro(slot, 1.0f / static_cast<float>(K), doutput, ready);
      // The loss after the backward is queued: a device backend waits for it here, while
      // the gradient buckets' all-reduces go on.
      if (last) losses[m] = backend_->TakeLoss(slot);
      // aux: the stage; bytes: the input gradient sent back (0 on the first stage).
      Trace(TraceKind::kBackward, t, m, first ? 0 : wire, shape_.pp_rank);
      if (!first) {
        if (grad_sends_[slot]) {
          backend_->Enter(Phase::kBubble);
          t = TraceStart();
          grad_sends_[slot]->Wait();
          Trace(TraceKind::kPpSendWait, t, m, 0, shape_.pp_rank - 1);
          backend_->Enter(Phase::kBackward);
        }
        backend_->CopyStage(grad_out_[slot], backend_->InputGrad());
        grad_sends_[slot] = grad_comm()->Send(static_cast<const float*>(grad_out_[slot]), words,
                                              shape_.pp_rank - 1, Tag(m, kGradient));
        bytes->pp_send_recv += wire;
      }
    }
  }
  if (options_.trace) options_.trace->set_micro(-1);
  backend_->Enter(Phase::kBubble);
  const int64_t drain = TraceStart();
  WaitSends();
  if (shape_.pp_size > 1) Trace(TraceKind::kPpSendWait, drain);
  if (shape_.tp_size > 1) {
    // Two all-reduces of (B, T, C) per block in each direction per micro-batch (gpt.h).
    const size_t blocks = static_cast<size_t>(shape_.last_block() - shape_.first_block());
    bytes->tp_all_reduce = blocks * static_cast<size_t>(K) * 4 * backend_->tp_all_reduce_bytes();
  }
  double loss_sum = 0.0;  // in micro-batch order, whatever order the backward passes ran in
  for (float l : losses) loss_sum += l;
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
  Backend& be = *backend_;
  StepResult r;
  const bool sample = block_sample_every_ > 0 && (step_ + 1) % block_sample_every_ == 0;
  if (sample) {
    block_costs_.Reset(be.shard().first_block, be.shard().last_block - be.shard().first_block);
    be.set_block_costs(&block_costs_);
  }
  be.BeginStep();
  const int64_t step_start = options_.trace ? options_.trace->BeginStep(step_ + 1) : 0;
  be.ZeroGrad();
  GradSync* sync = be.grad_sync();
  if (sync != nullptr) sync->Begin();
  const double loss_sum = RunSchedule(&r.comm);
  if (!Alone(comms_.pp)) {
    // The pipeline drains: a stage that finished its ops waits for the others here, which is
    // bubble (otherwise it would show as waiting on the step's later collectives).
    be.Enter(Phase::kBubble);
    const int64_t t = TraceStart();
    comms_.pp->Barrier()->Wait();
    Trace(TraceKind::kPipelineDrain, t);
  }
  float loss = static_cast<float>(loss_sum / K);
  const bool alone = Alone(comms_.world);
  if (sync != nullptr) {
    be.Enter(Phase::kCommExposed);
    const int64_t t = TraceStart();
    sync->Finish();
    r.comm.dp_all_reduce = sync->bytes_per_step();
    Trace(TraceKind::kDpWait, t, -1, r.comm.dp_all_reduce);
    if (options_.trace) {
      // The buckets ran on the communication thread while backward went on: their own records.
      const std::vector<GradSync::Span> spans = sync->spans();
      for (size_t i = 0; i < spans.size(); ++i) {
        options_.trace->Record(TraceKind::kDpBucketAllReduce, spans[i].began, spans[i].done, -1,
                               spans[i].bytes, static_cast<int32_t>(i));
      }
    }
  }
  if (comms_.emb != nullptr) {
    // The tied embedding: the first stage's wte gradient (the encoder) plus the last stage's
    // (the head) is the whole model's.
    be.Enter(Phase::kCommExposed);
    const int64_t t = TraceStart();
    r.comm.emb_all_reduce = be.SumEmbeddingGrad(comms_.emb);
    Trace(TraceKind::kEmbAllReduce, t, -1, r.comm.emb_all_reduce);
  }
  if (zero1()) {
    // ZeRO-1: this rank's range of the dp mean. Both sums are linear, so the embedding group's
    // sum above (of the whole wte, before the dp sum) gives the same total as the other order;
    // it cannot come after, on the range, because the first and the last stage's ranges cover
    // different parts of wte. The bytes count as "all_reduce", the dp gradient kind that loomd
    // knows (server/metrics), at the padded input's size, as the all-reduce would be.
    be.Enter(Phase::kCommExposed);
    const auto start = std::chrono::steady_clock::now();
    const int64_t t = TraceStart();
    r.comm.dp_all_reduce = be.ZeroReduceScatter(1.0f / static_cast<float>(shape_.dp_size));
    // All of it exposed: no buckets, so the overlap ratio stays 0.
    r.dp_comm_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    Trace(TraceKind::kZeroReduceScatter, t, -1, r.comm.dp_all_reduce);
  }
  be.Enter(Phase::kOptimizer);
  const int64_t optimizer_start = TraceStart();
  const bool stop_here = options_.stop_requested && options_.stop_requested();
  if (alone) {
    r.grad_norm = be.GradNorm();
    r.stop_requested = stop_here;
  } else {
    // One world all-reduce carries the loss (from the last stage's tensor rank 0, averaged over
    // dp) and the squared gradient norm (each tensor once: its owners, on dp rank 0, or under
    // ZeRO-1 on every dp rank for the part of them inside its range; the ranges tile the buffer).
    // The norm travels in parts (GradNormParts), each held by one stage, so the sum below does
    // not depend on the pipeline split. The second value counts the ranks asked to stop: the
    // gang agrees on this step to save at.
    const int layers = be.dims().layers;
    std::vector<double> parts(static_cast<size_t>(GradNormParts(layers)), 0.0);
    if (zero1() || shape_.dp_rank == 0) be.OwnedGradSumSquares(parts.data());
    std::vector<float> shared(2 + parts.size());
    shared[0] =
        last_stage() && shape_.tp_rank == 0 ? loss / static_cast<float>(shape_.dp_size) : 0.0f;
    shared[1] = stop_here ? 1.0f : 0.0f;
    for (size_t i = 0; i < parts.size(); ++i) shared[2 + i] = static_cast<float>(parts[i]);
    const size_t bytes = shared.size() * sizeof(float);
    be.Enter(Phase::kCommExposed);
    const int64_t t = TraceStart();
    be.AllReduceHost(comms_.world, shared.data(), shared.size());
    r.comm.world_all_reduce = bytes;
    Trace(TraceKind::kWorldAllReduce, t, -1, bytes);
    be.Enter(Phase::kOptimizer);
    loss = shared[0];
    r.stop_requested = shared[1] > 0.5f;
    double sumsq = 0.0;
    for (size_t i = 0; i < parts.size(); ++i) sumsq += static_cast<double>(shared[2 + i]);
    r.grad_norm = std::sqrt(std::max(sumsq, 0.0));
  }
  if (!std::isfinite(loss)) {
    throw BadInput("train.lr", "the loss became " + std::to_string(loss) + " at step " +
                                   std::to_string(step_ + 1) +
                                   ": training diverged (lower the learning rate)");
  }
  r.lr = LearningRate(schedule_, step_);
  be.ClipAndUpdate(r.grad_norm, config_.grad_clip, static_cast<float>(r.lr));
  // The world all-reduce above is a record nested inside this one.
  Trace(TraceKind::kOptimizer, optimizer_start);
  if (zero1()) {
    // Every dp rank updated its range; everyone needs every range.
    be.Enter(Phase::kCommExposed);
    const int64_t t = TraceStart();
    r.comm.all_gather = be.ZeroGatherParams();
    Trace(TraceKind::kZeroAllGather, t, -1, r.comm.all_gather);
  }
  ++step_;
  r.times = be.EndStep(int64_t{B} * T * K);  // this rank's tokens, as before
  Trace(TraceKind::kStep, step_start);
  if (sample) {
    be.set_block_costs(nullptr);
    r.has_block_costs = true;
    r.block_costs = block_costs_;
  }
  r.step = step_;
  r.loss = loss;
  r.allreduce_bytes = r.comm.dp_all_reduce;
  const double step_s = r.times.step_seconds;
  const double exposed = r.times.phase(Phase::kCommExposed);
  const double bubble = r.times.phase(Phase::kBubble);
  if (sync != nullptr) {
    // Device backends know their buckets' times once the step's work has run (EndStep).
    r.dp_comm_seconds = sync->comm_seconds();
    if (r.dp_comm_seconds > 0.0) {
      r.overlap_ratio = std::clamp(1.0 - sync->wait_seconds() / r.dp_comm_seconds, 0.0, 1.0);
    }
  }
  if (step_s > 0.0) {
    r.bubble_ratio = shape_.pp_size > 1 ? bubble / step_s : 0.0;
    r.idle_ratio = (exposed + bubble) / step_s;
  }
  be.FillMemory(TrainerBytes(), &r);
  return r;
}

float Trainer::Evaluate() {
  const size_t words = backend_->stage_floats();
  const bool first = first_stage(), last = last_stage();
  if (act_in_.empty() && !first) act_in_.push_back(backend_->NewStageBuffer());
  // Evaluation is not on the timeline: its tensor-parallel all-reduces would land in the last
  // training step's records.
  backend_->set_trace(nullptr);
  double sum = 0.0;
  for (int i = 0; i < eval_batches_.num_batches(); ++i) {
    eval_batches_.Fill(i, inputs_[0].data(), targets_[0].data());
    const void* input = nullptr;
    if (!first) {
      comms_.pp
          ->Recv(static_cast<float*>(act_in_[0]), words, shape_.pp_rank - 1,
                 Tag(i, kEvalActivation))
          ->Wait();
      input = act_in_[0];
    }
    backend_->ForwardMicro(0, inputs_[0].data(), input, last ? targets_[0].data() : nullptr);
    if (last) sum += backend_->TakeLoss(0);
    if (!last) {
      // Slot 0 is overwritten by the next batch: the send must be done first.
      comms_.pp
          ->Send(static_cast<const float*>(backend_->Output(0)), words, shape_.pp_rank + 1,
                 Tag(i, kEvalActivation))
          ->Wait();
    }
  }
  float mean = static_cast<float>(sum / eval_batches_.num_batches());
  if (!Alone(comms_.world)) {
    // Every dp rank evaluated the same batches: one copy (dp 0, tp 0 of the last stage) counts.
    float shared = last && shape_.tp_rank == 0 && shape_.dp_rank == 0 ? mean : 0.0f;
    backend_->AllReduceHost(comms_.world, &shared, 1);
    mean = shared;
  }
  backend_->set_trace(options_.trace);
  return mean;
}

std::string Trainer::Save(const std::string& root, int64_t generation) {
  CheckpointMeta meta = MetaOf(shape_, backend_->dims(), config_.seed, step_, generation);
  meta.zero1 = zero1();
  meta.optimizer_step = backend_->optimizer_step();
  const std::vector<TensorInfo>& table = backend_->tensors();
  // The writers' copy of the state (a device backend copies it to the host).
  const Backend::HostState state =
      Alone(comms_.world) || shape_.dp_rank == 0 ? backend_->StateToHost() : Backend::HostState{};
  if (Alone(comms_.world)) {
    return SaveCheckpoint(root, table, state.params, state.m, state.v, meta);
  }

  // Under ZeRO-1 every dp rank holds a range of the moments: gather them (a dp collective, so
  // every dp rank takes part) for the writer.
  std::vector<float> p_full, m_full, v_full;
  const float* params = state.params;
  const float* m = state.m;
  const float* v = state.v;
  if (zero1()) {
    backend_->GatherState(&p_full, &m_full, &v_full);
    if (!p_full.empty()) params = p_full.data();  // the GPU shards its master weights too
    m = m_full.data();
    v = v_full.data();
  }
  for (int p = 0; p < shape_.pp_size; ++p) {
    for (int t = 0; t < shape_.tp_size; ++t) meta.shards.push_back(ShardName(p, t));
  }
  std::string staging;
  if (shape_.dp_rank == 0) {
    staging = StageCheckpoint(root, step_, generation);
    WriteShard(staging, ShardName(shape_.pp_rank, shape_.tp_rank), table, params, m, v);
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
  const size_t n = backend_->num_params();
  const size_t begin = backend_->update_begin(), end = backend_->update_end();
  // This rank's boxes of the parameters, and its range of the moments (MomentRange).
  std::vector<float> params(n), m(end - begin), v(end - begin);
  CheckpointMeta meta =
      LoadShardedCheckpoint(dir, backend_->dims(), backend_->tensors(), params.data(), m.data(),
                            v.data(), MomentRange{begin, end});
  backend_->LoadState(params.data(), m.data(), v.data(),
                      meta.optimizer_step >= 0 ? meta.optimizer_step : meta.step);
  step_ = meta.step;
  return meta;
}

size_t Trainer::TrainerBytes() const {
  size_t buffers = 0;
  for (const auto* v : {&inputs_, &targets_}) {
    for (const std::vector<int>& b : *v) buffers += b.capacity() * sizeof(int);
  }
  return data_.bytes_owned() + buffers;
}

size_t Trainer::bytes_allocated() const { return backend_->bytes_allocated() + TrainerBytes(); }

}  // namespace loom::train
