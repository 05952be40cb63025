// Data parallelism on the GPU path (the CUDA backend + CudaGradSync behind the step loop) in the
// CPU emulation, against the
// one-"GPU" run: two emulated ranks of dp = 2 must give the one-rank loss curve within bf16's
// tolerance, and the same loss and gradient norm on both ranks.
//
// Test role: LockstepNccl stands in for NCCL (there is no NCCL here). The two ranks are host
// threads that take turns (the emulator runs one thread's kernels at a time: `turn`); a
// collective hands the turn over, meets the peer at a barrier, lets rank 0 combine both buffers
// (bf16 sums rounded as NCCL rounds them, after each addition) and meets again. Work completes
// at once; the communication stream is an emulated stream, so events and waits on it are real
// emulator calls, but nothing overlaps. What this checks: the bucket offsets on the padded
// layout, packing and unpacking, the 1/(K·dp) loss scale, the sampler's dp rank, the loss
// average. What it cannot: stream ordering, timing, real NCCL.
//
// Usage: emu_dp_check [STEPS] [VOCAB]. Prints one line per step and PASS or FAIL.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/train/comm/nccl_communicator.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/cuda_backend.h"
#include "worker/train/data/dataset.h"
#include "worker/train/trainer.h"

namespace loom::train {

namespace {

float FromBf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint16_t ToBf16(float f) {  // round to nearest even, as the CUDA conversion
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// What the two ranks share: the turn, the meeting point and each rank's buffers of the
// collective in progress.
struct Lockstep {
  std::mutex turn;
  std::barrier<> meet{2};
  const void* in[2] = {nullptr, nullptr};
  void* out[2] = {nullptr, nullptr};
};

class LockstepNccl : public NcclCommunicator {
 public:
  LockstepNccl(Lockstep* shared, int rank) : shared_(shared), rank_(rank) {
    if (cudaStreamCreate(&stream_) != cudaSuccess) std::abort();
  }
  int rank() const override { return rank_; }
  int size() const override { return 2; }

  WorkHandle AllReduceSum(float* data, size_t n) override {
    return Collective(data, data, [n](Lockstep& s) {
      auto* a = static_cast<float*>(s.out[0]);
      auto* b = static_cast<float*>(s.out[1]);
      for (size_t i = 0; i < n; ++i) b[i] = a[i] = a[i] + b[i];
    });
  }
  WorkHandle AllReduceSum(void* data, size_t n, DeviceDType type) override {
    if (type == DeviceDType::kFloat32) return AllReduceSum(static_cast<float*>(data), n);
    return Collective(data, data, [n](Lockstep& s) {
      auto* a = static_cast<uint16_t*>(s.out[0]);
      auto* b = static_cast<uint16_t*>(s.out[1]);
      for (size_t i = 0; i < n; ++i) b[i] = a[i] = ToBf16(FromBf16(a[i]) + FromBf16(b[i]));
    });
  }
  WorkHandle AllGather(const float* in, float* out, size_t n) override {
    return Collective(in, out, [n](Lockstep& s) {
      for (int r = 0; r < 2; ++r) {
        for (int from = 0; from < 2; ++from) {
          std::memcpy(static_cast<float*>(s.out[r]) + from * n, s.in[from], n * sizeof(float));
        }
      }
    });
  }
  WorkHandle Barrier() override { return Collective(nullptr, nullptr, [](Lockstep&) {}); }

  // Not used by the data-parallel GPU path.
  WorkHandle ReduceScatterSum(const float*, float*, size_t) override { return Unused(); }
  WorkHandle Broadcast(float*, size_t, int) override { return Unused(); }
  WorkHandle Send(const float*, size_t, int, uint32_t) override { return Unused(); }
  WorkHandle Recv(float*, size_t, int, uint32_t) override { return Unused(); }
  WorkHandle ReduceScatterSum(const void*, void*, size_t, DeviceDType) override { return Unused(); }
  WorkHandle AllGather(const void*, void*, size_t, DeviceDType) override { return Unused(); }
  WorkHandle SendRecv(const float*, size_t, int, float*, size_t, int) override { return Unused(); }
  void Abort(const std::string&) override {}

  void SetComputeStream(cudaStream_t) override {}
  cudaStream_t stream() const override { return stream_; }
  void StreamWaitAll(cudaStream_t) override {}  // every collective completed when issued
  int device() const override { return 0; }

  int collectives() const { return collectives_; }

 private:
  // Hands the turn to the peer, meets it, lets rank 0 run `combine` on both ranks' buffers,
  // meets again and takes a turn back.
  template <typename Combine>
  WorkHandle Collective(const void* in, void* out, Combine combine) {
    shared_->in[rank_] = in;
    shared_->out[rank_] = out;
    shared_->turn.unlock();
    shared_->meet.arrive_and_wait();
    if (rank_ == 0) combine(*shared_);
    shared_->meet.arrive_and_wait();
    shared_->turn.lock();
    ++collectives_;
    return CompletedWork();
  }
  static WorkHandle Unused() {
    std::fprintf(stderr, "emu_dp_check: a collective the data-parallel path does not use\n");
    std::abort();
  }

  Lockstep* shared_;
  int rank_;
  cudaStream_t stream_ = nullptr;
  int collectives_ = 0;
};

// The CUDA backend of one rank holding the whole model, over `group` (dp and world) or alone.
std::unique_ptr<CudaBackend> GpuBackend(const JobConfig& c, LockstepNccl* group) {
  CudaBackendOptions o;
  o.adam.weight_decay = static_cast<float>(c.weight_decay);
  o.world = group;
  o.dp = group;
  o.bucket_bytes = 8 << 10;  // small, so that tiny's gradients need many, overlapped with backward
  return std::make_unique<CudaBackend>(c.model, ModelShard{1, 0, 0, c.model.layers}, c.seed, o);
}

}  // namespace
}  // namespace loom::train

int main(int argc, char** argv) {
  using namespace loom::train;
  const int steps = argc > 1 ? std::atoi(argv[1]) : 3;
  JobConfig c;
  c.preset = "tiny";
  c.model = *PresetDims("tiny");
  if (argc > 2) c.model.vocab = std::atoi(argv[2]);
  c.data_builtin = "tiny-corpus";
  c.steps = steps;
  c.seq_len = 32;
  c.micro_batch = 2;
  c.global_batch_tokens = 2 * 2 * 32;  // one rank: K = 2 micro-batches; dp = 2: one each
  c.lr = 3e-3;
  Dataset data = Dataset::Load("", "tiny-corpus", "", c.model.vocab, c.seq_len);
  const BatchShape one = ResolveBatchShape(c, RankEnv{});

  std::vector<StepResult> single;
  {
    Trainer gpu(c, one, data, TrainerComms{}, TrainerOptions{}, GpuBackend(c, nullptr));
    for (int s = 0; s < steps; ++s) single.push_back(gpu.Step());
  }

  Lockstep shared;
  std::vector<std::vector<StepResult>> ranks(2);
  std::vector<size_t> buckets(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      shared.turn.lock();
      BatchShape shape = one;
      shape.K = 1;
      shape.dp_size = 2;
      shape.dp_rank = r;
      {
        LockstepNccl group(&shared, r);  // the world and the dp group (tp = pp = 1)
        TrainerOptions options;
        options.bucket_bytes = 8 << 10;
        Trainer t(c, shape, data, TrainerComms{&group, &group, nullptr, nullptr, nullptr}, options,
                  GpuBackend(c, &group));
        buckets[r] = t.num_buckets();
        for (int s = 0; s < steps; ++s) ranks[r].push_back(t.Step());
      }
      shared.turn.unlock();
    });
  }
  for (std::thread& t : threads) t.join();

  int failures = 0;
  std::printf("dp = 2, vocab %d, %zu buckets per rank\n", c.model.vocab, buckets[0]);
  for (int s = 0; s < steps; ++s) {
    const StepResult& a = ranks[0][s];
    const StepResult& b = ranks[1][s];
    const double rel_loss = std::fabs(a.loss - single[s].loss) / single[s].loss;
    const double rel_norm = std::fabs(a.grad_norm - single[s].grad_norm) / single[s].grad_norm;
    const bool same = a.loss == b.loss && a.grad_norm == b.grad_norm;
    const bool ok = same && std::isfinite(a.loss) && rel_loss <= 0.02 && rel_norm <= 0.05 &&
                    a.comm.dp_all_reduce > 0;
    failures += !ok;
    std::printf(
        "%s  step %d: loss %.6f (ranks %s) vs one rank %.6f, rel %.1e; norm %.6f vs %.6f, "
        "rel %.1e; %zu bytes all-reduced\n",
        ok ? "PASS" : "FAIL", s + 1, a.loss, same ? "equal" : "DIFFER", single[s].loss, rel_loss,
        a.grad_norm, single[s].grad_norm, rel_norm, a.comm.dp_all_reduce);
  }
  std::printf("%s: data parallel on the emulated GPU path, %d failure(s)\n",
              failures ? "FAIL" : "OK", failures);
  return failures ? 1 : 0;
}
