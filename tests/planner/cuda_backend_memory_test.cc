// The GPU backend's memory (cuda_backend_memory.h): hand-computed components for two shapes,
// growth with the micro-batch, the data-parallel buckets, and which model the evaluator picks.
#include "server/planner/cuda_backend_memory.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/planner/device_spec.h"
#include "server/planner/layout.h"
#include "server/planner/layout_evaluator.h"
#include "server/planner/memory_model.h"
#include "server/planner/model_shape.h"

namespace loom::planner {
namespace {

constexpr double kGemmWorkspace = 32.0 * kMiB;

struct ByComponent {
  const char* preset;
  int micro_batch;
  double weights, gradients, optimizer, activations, embedding_and_logits, workspace;
  double fragmentation;
};

// Hand-computed from gpt_cuda.cc and cuda_backend.cc (every request rounded up to 512 B; none of
// these shapes leaves a tail the large pool keeps whole).
//
// Both presets have heads the fused attention kernels handle (16 and 64 channels): per block the
// fp32 log-sum-exp (B, NH, T) instead of the (B, NH, T, T) probabilities, and a scratch of one
// fp32 per query and head.
//
// tiny (L=2, C=64, NH=4, T=64, V=256 = Vp, n = P = 120,576), B=2, N=128:
//  weights = gradients = 2n = 241,152; optimizer = 3·4n = 1,446,912.
//  activations: L·(2·N·16·C + 16·N + 4·B·NH·T) = 2·(262,144 + 2,048 + 2,048) = 532,480; the
//    four stacked fp32 statistics (L·N·4 = 1,024 B) and the log-sum-exp (4,096 B) are already
//    multiples of 512.
//  embedding_and_logits: encoded, proj, lnf 3·16,384; logits, dlogits 2·65,536; seven fp32 or
//    int32 vectors of N (512 B each) = 49,152 + 131,072 + 3,584 = 183,808.
//  workspace: 2·14·N·C = 229,376; layernorm scratch 4·2·2·64 = 1,024; attention scratch
//    4·B·NH·T = 2,048; norm partials 4,096 and result 512; the backend's 16 host values 512;
//    GEMM 32 MiB: 237,568 + 33,554,432 = 33,792,000.
//  fragmentation: all of it is in the small pool, 2,883,072 B of blocks in two 2 MiB segments:
//    4,194,304 − 2,883,072 = 1,311,232.
//
// gpt2-124m (L=12, C=768, NH=12, T=1024, V=50,257, Vp=50,304, P=124,439,808,
// n = P + 47·768 = 124,475,904), B=16, N=16,384:
//  weights = gradients = 2n = 248,951,808; optimizer = 12P = 1,493,277,696 (the masters and
//    moments are kept in the table's layout: no padding rows).
//  activations: 12·(2·16,384·16·768 + 16·16,384 + 4·16·12·1024)
//    = 12·(402,653,184 + 262,144 + 786,432) = 4,844,421,120 (half of the unfused kernels'
//    9,666,822,144: the probabilities were as large as all the other activations together).
//  embedding_and_logits: 3·2·N·C = 75,497,472; 2·2·N·Vp = 3,296,722,944; 7·4·N = 458,752:
//    3,372,679,168.
//  workspace: 2·14·N·C = 352,321,536; layernorm 4·2·256·768 = 1,572,864; attention
//    4·16·12·1024 = 786,432; 4,096 + 512; the host values 512; GEMM 33,554,432: 388,240,384.
//  fragmentation: the 9 MiB log-sum-exp opens a 20 MiB segment, the 1.5 MiB layernorm scratch
//    takes its best fit from the 11 MiB left (9.5 MiB stay free); the small pool holds the
//    norm's 4,096 + 512, the host values' 512, four 786,432 B statistics, the 786,432 B
//    attention scratch and seven 65,536 B vectors, 4,396,032 B in three 2 MiB segments:
//    9,961,472 + 1,895,424 = 11,856,896.
const ByComponent kByComponent[] = {
    {"tiny", 2, 241'152, 241'152, 1'446'912, 532'480, 183'808, 33'792'000, 1'311'232},
    {"gpt2-124m", 16, 248'951'808, 248'951'808, 1'493'277'696, 4'844'421'120, 3'372'679'168,
     388'240'384, 11'856'896},
};

TEST(CudaBackendMemoryTest, HandComputedComponents) {
  for (const ByComponent& c : kByComponent) {
    SCOPED_TRACE(std::string(c.preset) + " b=" + std::to_string(c.micro_batch));
    Layout l;
    l.micro_batch = c.micro_batch;
    l.num_micro_batches = 3;  // accumulation reuses the buffers: no effect
    const absl::StatusOr<MemoryBreakdown> r =
        CudaBackendMemory(*ResolvePreset(c.preset), Precision::kBf16, l);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_DOUBLE_EQ(r->weights, c.weights);
    EXPECT_DOUBLE_EQ(r->gradients, c.gradients);
    EXPECT_DOUBLE_EQ(r->optimizer, c.optimizer);
    EXPECT_DOUBLE_EQ(r->activations, c.activations);
    EXPECT_DOUBLE_EQ(r->embedding_and_logits, c.embedding_and_logits);
    EXPECT_DOUBLE_EQ(r->workspace, c.workspace);
    EXPECT_DOUBLE_EQ(r->comm_buffers, 0);
    EXPECT_DOUBLE_EQ(r->fragmentation, c.fragmentation);
    EXPECT_DOUBLE_EQ(r->runtime_reserve, kGiB);
    EXPECT_DOUBLE_EQ(r->allocated(), c.weights + c.gradients + c.optimizer + c.activations +
                                         c.embedding_and_logits + c.workspace);
  }
}

// ZeRO-1 over dp = 2 (cuda_zero.h): dp rank 0 holds the masters and moments of ceil(P / 2) of
// tiny's P = 120,576 parameters, GptCuda's upload staging (2^18 floats) and CudaZero's staging
// of (dp + 1) pieces of that range in fp32, and no gradient buckets.
TEST(CudaBackendMemoryTest, ZeroOneHoldsItsRangeOfTheOptimizerState) {
  const ModelShape m = *ResolvePreset("tiny");
  Layout plain;
  plain.dp = 2;
  Layout zero = plain;
  zero.zero1 = true;
  const absl::StatusOr<MemoryBreakdown> p = CudaBackendMemory(m, Precision::kBf16, plain);
  const absl::StatusOr<MemoryBreakdown> z = CudaBackendMemory(m, Precision::kBf16, zero);
  ASSERT_TRUE(p.ok() && z.ok()) << p.status() << z.status();
  constexpr double kShard = 120'576 / 2;
  EXPECT_DOUBLE_EQ(p->optimizer, 12 * 120'576);
  EXPECT_DOUBLE_EQ(z->optimizer, 12 * kShard);
  EXPECT_DOUBLE_EQ(z->comm_buffers, 3 * kShard * 4);
  EXPECT_DOUBLE_EQ(z->workspace, p->workspace + 4 * (1 << 18));
  EXPECT_DOUBLE_EQ(z->weights, p->weights);
  EXPECT_DOUBLE_EQ(z->gradients, p->gradients);
}

// gpt2-124m at b = 16 on one GPU is about 9.9 GiB allocated with the fused attention (14.4 GiB
// with the unfused kernels' probabilities), not the published formula's 27.3 GiB.
TEST(CudaBackendMemoryTest, Gpt2SmallIsHalfThePublishedFormula) {
  Layout l;
  l.micro_batch = 16;
  const ModelShape m = *ResolvePreset("gpt2-124m");
  const MemoryBreakdown cuda = *CudaBackendMemory(m, Precision::kBf16, l);
  EXPECT_DOUBLE_EQ(cuda.allocated(), 10'596'521'984);  // 9.87 GiB
  const MemoryBreakdown formula =
      StageMemory(m, Precision::kBf16, l, *DefaultDevice("H200", 1, 1), 0, m.layers);
  EXPECT_GT(formula.total() / cuda.total(), 1.7);
}

TEST(CudaBackendMemoryTest, GrowsWithTheMicroBatch) {
  const ModelShape m = *ResolvePreset("gpt2-124m");
  auto at = [&](int b) {
    Layout l;
    l.micro_batch = b;
    return *CudaBackendMemory(m, Precision::kBf16, l);
  };
  const MemoryBreakdown two = at(2);
  double previous = 0;
  for (int b : {1, 2, 3, 4, 8, 16, 32, 64}) {
    SCOPED_TRACE(b);
    const MemoryBreakdown r = at(b);
    EXPECT_GT(r.allocated(), previous);
    EXPECT_GT(r.total(), r.allocated());
    previous = r.allocated();
    EXPECT_DOUBLE_EQ(r.weights + r.gradients + r.optimizer,
                     two.weights + two.gradients + two.optimizer);
    // T = 1024 makes every activation request a multiple of 512 B: linear in b up to a tail of
    // at most 1 MiB that the allocator hands out with a block instead of splitting it off (at
    // b = 32 the 18 MiB log-sum-exp leaves 2 MiB of its 20 MiB segment to a later request).
    if (b >= 2) {
      EXPECT_NEAR(r.activations, b / 2.0 * two.activations, 1 << 20);
    }
  }
  // At b = 1 the 18 MiB ln1 takes the 18.5 MiB left in the 20 MiB segment that the 1.5 MiB
  // `encoded` opened, and the 0.5 MiB rest is not split off: the allocator counts it.
  EXPECT_DOUBLE_EQ(at(1).activations, two.activations / 2 + 512 * 1024);
}

// dp > 1 adds one bf16 copy of the (padded) gradients in buckets of at most 25 MiB, the loss's
// fp32 sum and the resume-step gather; nothing else changes.
TEST(CudaBackendMemoryTest, DataParallelAddsTheGradientBuckets) {
  for (const char* preset : {"tiny", "gpt2-124m"}) {
    SCOPED_TRACE(preset);
    const ModelShape m = *ResolvePreset(preset);
    Layout one;
    one.micro_batch = 4;
    Layout four = one;
    four.dp = 4;
    const MemoryBreakdown a = *CudaBackendMemory(m, Precision::kBf16, one);
    const MemoryBreakdown b = *CudaBackendMemory(m, Precision::kBf16, four);
    EXPECT_DOUBLE_EQ(a.comm_buffers, 0);
    EXPECT_DOUBLE_EQ(b.weights, a.weights);
    EXPECT_DOUBLE_EQ(b.activations, a.activations);
    // The buckets come first and change which free tails later requests find: up to one tail
    // of at most 1 MiB handed out whole.
    EXPECT_NEAR(b.embedding_and_logits, a.embedding_and_logits, 1 << 20);
    EXPECT_DOUBLE_EQ(b.workspace, a.workspace);
    int buckets = 0;
    double bucket_bytes = 0;
    for (const CudaBufferRequest& q : CudaBackendRequests(m, four)) {
      if (q.name.rfind("bucket ", 0) != 0) continue;
      ++buckets;
      bucket_bytes += double(q.bytes);
      EXPECT_EQ(q.component, &MemoryBreakdown::comm_buffers);
    }
    EXPECT_DOUBLE_EQ(bucket_bytes, b.weights);  // one bf16 gradient copy, padding included
    // Each bucket rounded to 512 B; the loss sum 512 B (the backend's host-value staging buffer
    // is workspace, with or without data parallelism).
    EXPECT_GE(b.comm_buffers, bucket_bytes + 512);
    EXPECT_LE(b.comm_buffers, bucket_bytes + 512.0 * buckets + 512);
  }
  // gpt2-124m: 124,475,904 bf16 gradients packed at whole pieces into buckets of at most
  // 13,107,200 elements (25 MiB): 7 of about 12M, 2,557,440 (block 0's end and wpe), then wte
  // with its padding alone, 38,633,472.
  Layout l;
  l.dp = 2;
  int buckets = 0;
  for (const CudaBufferRequest& q : CudaBackendRequests(*ResolvePreset("gpt2-124m"), l)) {
    buckets += q.name.rfind("bucket ", 0) == 0;
  }
  EXPECT_EQ(buckets, 9);
}

TEST(CudaBackendMemoryTest, RefusesWhatTheGpuBackendDoesNotRun) {
  const ModelShape m = *ResolvePreset("tiny");
  struct Refused {
    const char* what;
    Precision precision;
    Layout layout;
  };
  std::vector<Refused> cases;
  cases.push_back({"fp32", Precision::kFp32, Layout{}});
  Layout tp;
  tp.tp = 3;  // does not divide tiny's 4 heads
  cases.push_back({"tensor 3", Precision::kBf16, tp});
  Layout recompute;
  recompute.recompute = Recompute::kSelective;
  cases.push_back({"recompute", Precision::kBf16, recompute});
  for (const Refused& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_EQ(CudaBackendMemory(m, c.precision, c.layout).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  Layout pp;
  pp.pp = 2;
  EXPECT_EQ(CudaBackendMemory(m, Precision::kBf16, pp, /*stage=*/2).status().code(),
            absl::StatusCode::kInvalidArgument);  // no stage 2 of 2
}

// Tensor and pipeline shards (issue 14): the GPU backend's buffers of one rank's part. tiny
// (L=2, C=64, NH=4, V=256 = Vp, T=64), B=2: every request is a multiple of 512 B, so the
// components add up exactly.
TEST(CudaBackendMemoryTest, ShardsHoldTheirPartOfTheModel) {
  const ModelShape m = *ResolvePreset("tiny");
  Layout one;
  one.micro_batch = 2;
  one.num_micro_batches = 2;
  const MemoryBreakdown whole = *CudaBackendMemory(m, Precision::kBf16, one);

  // Pipeline of 2, one block per stage, 1F1B with 2 micro-batches: stage 0 keeps both in
  // flight, stage 1 one. The bf16 parameters of the two stages are the whole model's plus the
  // head's copy of the tied wte (V·C = 16,384 bf16), up to each stage's rounding to 512 B.
  Layout pp = one;
  pp.pp = 2;
  const MemoryBreakdown s0 = *CudaBackendMemory(m, Precision::kBf16, pp, 0, 1);
  const MemoryBreakdown s1 = *CudaBackendMemory(m, Precision::kBf16, pp, 1, 1);
  EXPECT_NEAR(s0.weights + s1.weights, whole.weights + 2.0 * 256 * 64, 2 * 512.0);
  // Stage 0: two slots of one block is the whole model's one slot of two blocks.
  EXPECT_DOUBLE_EQ(s0.activations, whole.activations);
  EXPECT_DOUBLE_EQ(s1.activations, whole.activations / 2);
  // Only the last stage holds logits; the first holds no head at all.
  EXPECT_LT(s0.embedding_and_logits, s1.embedding_and_logits);
  // Stage buffers: (B, T, C) bf16 = 16,384 B each, two per slot on each side of the cut.
  EXPECT_DOUBLE_EQ(s0.comm_buffers, 2 * 2 * 16384.0);
  EXPECT_DOUBLE_EQ(s1.comm_buffers, 1 * 2 * 16384.0);

  // Tensor parallel 2: the sliced widths halve (qkv 3C, atty C, fch and fch_gelu 4C of the 16
  // values of width C, and the attention's log-sum-exp of NH/2 heads), the replicated ones (ln1,
  // residual2, ln2, residual3) and the statistics stay.
  Layout tp = one;
  tp.tp = 2;
  const MemoryBreakdown t = *CudaBackendMemory(m, Precision::kBf16, tp);
  const double N = 2 * 64, C = 64, L = 2, B = 2, NH = 4, T = 64;
  const double sliced = L * (2 * N * 12 * C + 4 * B * NH * T) / 2;
  const double kept = L * (2 * N * 4 * C + 16 * N);
  EXPECT_DOUBLE_EQ(t.activations, sliced + kept);
  EXPECT_DOUBLE_EQ(whole.activations, 2 * sliced + kept);
  EXPECT_LT(t.weights, whole.weights);
  EXPECT_GT(t.weights, whole.weights / 2);  // the embeddings are replicated
}

// The allocator simulation's rules on small cases (the replay test checks it against the real
// allocator at scale).
TEST(SimulateCachingAllocatorTest, RoundsPoolsAndSplits) {
  struct Case {
    const char* what;
    std::vector<int64_t> requests;
    std::vector<int64_t> blocks;
    int64_t reserved;
  };
  const int64_t MiB = int64_t{1} << 20;
  const Case cases[] = {
      {"rounded to 512", {1, 512, 513}, {512, 512, 1024}, 2 * MiB},
      {"small pool best fit", {MiB, MiB, 512 * 1024}, {MiB, MiB, 512 * 1024}, 4 * MiB},
      {"large request, own segment", {30 * MiB}, {30 * MiB}, 30 * MiB},
      {"tail of 1 MiB is not split off", {19 * MiB}, {20 * MiB}, 20 * MiB},
      {"tail above 1 MiB is", {18 * MiB, 2 * MiB - 512}, {18 * MiB, 2 * MiB}, 20 * MiB},
      {"small and large never share", {2 * MiB, 512}, {2 * MiB, 512}, 22 * MiB},
      {"zero bytes take nothing", {0}, {0}, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const CachingAllocatorState s = SimulateCachingAllocator(c.requests);
    EXPECT_EQ(s.block_bytes, c.blocks);
    EXPECT_EQ(s.reserved, c.reserved);
    int64_t sum = 0;
    for (int64_t b : c.blocks) sum += b;
    EXPECT_EQ(s.allocated, sum);
  }
}

// The evaluator uses GptCuda's layout for what the GPU backend runs and the published formula
// for the Megatron-style layouts it does not run yet.
TEST(CudaBackendMemoryTest, EvaluatorPicksTheBackendModelForDataParallelBf16) {
  const ModelShape m = *ResolvePreset("gpt2-124m");
  const DeviceSpec d = *DefaultDevice("H200", 2, 2);
  struct Case {
    const char* what;
    Precision precision;
    Layout layout;
    bool backend;  // CudaBackendMemory, else StageMemory
  };
  std::vector<Case> cases;
  Layout dp;
  dp.dp = 2;
  dp.micro_batch = 8;
  dp.num_micro_batches = 2;
  cases.push_back({"dp=2 bf16", Precision::kBf16, dp, true});
  cases.push_back({"dp=2 fp32", Precision::kFp32, dp, false});
  Layout tp;
  tp.tp = 2;
  tp.micro_batch = 8;
  cases.push_back({"tp=2", Precision::kBf16, tp, true});
  Layout recompute = dp;
  recompute.recompute = Recompute::kFull;
  cases.push_back({"dp=2 full recompute", Precision::kBf16, recompute, false});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Layout& l = c.layout;
    ASSERT_TRUE(ValidateLayout(m, d, l, int64_t{l.dp} * l.micro_batch * l.num_micro_batches).ok());
    const Evaluation ev = EvaluateLayout(m, c.precision, d, c.layout);
    const MemoryBreakdown want = c.backend ? *CudaBackendMemory(m, c.precision, c.layout)
                                           : StageMemory(m, c.precision, c.layout, d, ev.peak_stage,
                                                         ev.blocks_per_stage[ev.peak_stage]);
    EXPECT_DOUBLE_EQ(ev.peak_memory.allocated(), want.allocated());
    EXPECT_DOUBLE_EQ(ev.peak_memory.fragmentation, want.fragmentation);
    EXPECT_DOUBLE_EQ(ev.peak_memory.total(), want.total());
    EXPECT_DOUBLE_EQ(ev.headroom_bytes, d.memory_bytes - want.total());
    EXPECT_EQ(ev.fits, ev.headroom_bytes >= 0);
    // The formula keeps its 10% margin; the backend model has the allocator's exact slack.
    EXPECT_EQ(ev.peak_memory.fragmentation == kFragmentationFraction * want.allocated(),
              !c.backend);
  }
  // A GPU pipeline: each stage of the partition gets the backend's buffers for its blocks.
  Layout pp;
  pp.pp = 2;
  pp.micro_batch = 8;
  pp.num_micro_batches = 4;
  const Evaluation staged = EvaluateLayout(m, Precision::kBf16, d, pp);
  ASSERT_EQ(staged.stage_memory.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE("stage " + std::to_string(i));
    EXPECT_DOUBLE_EQ(
        staged.stage_memory[i].total(),
        CudaBackendMemory(m, Precision::kBf16, pp, i, staged.blocks_per_stage[i])->total());
  }
  EXPECT_EQ(staged.fits, staged.headroom_bytes >= 0);
  // A CPU device never gets the GPU backend's model (bf16 is not the CPU backend's either).
  const DeviceSpec cpu = *DefaultDevice("cpu", 2, 2);
  const Evaluation ev = EvaluateLayout(m, Precision::kBf16, cpu, dp);
  EXPECT_NE(ev.peak_memory.allocated(), CudaBackendMemory(m, Precision::kBf16, dp)->allocated());
}

// Fits exactly when the device holds the backend's total (allocator reserve + runtime), not
// the formula's.
TEST(CudaBackendMemoryTest, FitsByTheBackendTotal) {
  const ModelShape m = *ResolvePreset("gpt2-124m");
  Layout l;
  l.micro_batch = 16;
  const double need = CudaBackendMemory(m, Precision::kBf16, l)->total();
  DeviceSpec d = *DefaultDevice("H200", 1, 1);
  d.memory_bytes = need;
  EXPECT_TRUE(EvaluateLayout(m, Precision::kBf16, d, l).fits);
  d.memory_bytes = need - 1;
  EXPECT_FALSE(EvaluateLayout(m, Precision::kBf16, d, l).fits);
}

}  // namespace
}  // namespace loom::planner
