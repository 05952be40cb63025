// The planner's memory model against the CPU backend's measured peak (issue 6: "a small model's
// predicted memory against the CPU backend's measured peak", within 10%).
//
// Each case trains `tiny` or `small` (fp32) for two steps with the CPU training core
// (loom_train_core) and reads the trainer's peak of the bytes it accounts itself (parameters,
// gradients, Adam moments, activations, backward scratch, token buffers), minus the dataset's
// token stream (host data the planner does not model). That is compared with
//  - CpuBackendMemory (cpu_backend_memory.h), the CPU backend's own buffer layout: weights +
//    gradients + optimizer + activations + embedding_and_logits + workspace (comm_buffers is 0
//    at dp = 1); asserted within 10%;
//  - StageMemory (memory_model.h), the GPU formula (Korthikanti et al.), the same components
//    via MemoryBreakdown::allocated(), i.e. without the fragmentation margin and the runtime
//    reserve, which the CPU backend does not have. It is not asserted: it models the buffers of
//    a Megatron-style GPU block, not those of the CPU kernels, and misses by -14% (tiny, b = 8)
//    to +15% (small, b = 8); the test prints it for the record. Its parameter, gradient and
//    optimizer terms must still match the CPU backend exactly (16 B per parameter in fp32).
//
// This binary links the planner and the training core; neither depends on the other.
#include <cmath>
#include <cstdio>

#include <gtest/gtest.h>

#include "server/planner/cpu_backend_memory.h"
#include "server/planner/device_spec.h"
#include "server/planner/layout.h"
#include "server/planner/memory_model.h"
#include "server/planner/model_shape.h"
#include "worker/train/config/job_config.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/data/dataset.h"
#include "worker/train/model/dims.h"
#include "worker/train/trainer.h"

namespace loom::planner {
namespace {

struct Case {
  const char* preset;
  int micro_batch;        // B
  int num_micro_batches;  // K
};

class CpuMemoryValidationTest : public ::testing::TestWithParam<Case> {};

TEST_P(CpuMemoryValidationTest, PredictedPeakMatchesTheCpuBackend) {
  const Case c = GetParam();
  const ModelShape m = *ResolvePreset(c.preset);
  const std::optional<train::ModelDims> dims = train::PresetDims(c.preset);
  ASSERT_TRUE(dims.has_value());
  // The two preset tables must describe the same model.
  ASSERT_EQ(dims->layers, m.layers);
  ASSERT_EQ(dims->channels, m.hidden);
  ASSERT_EQ(dims->heads, m.heads);
  ASSERT_EQ(dims->max_seq_len, m.seq_len);
  ASSERT_EQ(dims->vocab, m.vocab);

  train::JobConfig config;
  config.preset = c.preset;
  config.model = *dims;
  config.data_builtin = "tiny-corpus";
  config.steps = 2;
  config.seq_len = m.seq_len;  // the planner's s is both T and the position table
  config.micro_batch = c.micro_batch;
  config.global_batch_tokens = int64_t{m.seq_len} * c.micro_batch * c.num_micro_batches;
  train::BatchShape shape;
  shape.B = c.micro_batch;
  shape.T = m.seq_len;
  shape.K = c.num_micro_batches;
  const train::Dataset data = train::Dataset::Load("", "tiny-corpus", "", m.vocab, m.seq_len);
  train::Trainer trainer(config, shape, data);
  size_t peak = 0;
  for (int i = 0; i < 2; ++i) peak = trainer.Step().peak_memory_bytes;
  ASSERT_GT(peak, data.bytes_owned());
  const double measured = double(peak - data.bytes_owned());
  ASSERT_EQ(double(trainer.model().num_params()), TotalParams(m));

  Layout layout;  // dp = tp = pp = 1, as the CPU backend runs one rank
  layout.micro_batch = c.micro_batch;
  layout.num_micro_batches = c.num_micro_batches;
  absl::StatusOr<MemoryBreakdown> cpu = CpuBackendMemory(m, Precision::kFp32, layout);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const MemoryBreakdown gpu = StageMemory(m, Precision::kFp32, layout,
                                          *DefaultDevice("cpu", 1, 1), 0, m.layers);
  EXPECT_DOUBLE_EQ(cpu->fragmentation + cpu->runtime_reserve, 0);
  EXPECT_DOUBLE_EQ(gpu.runtime_reserve, 0);  // the "cpu" device has none either
  // Parameters, gradients and Adam moments: both models, exactly the CPU backend's bytes.
  const double param_bytes = 16.0 * trainer.model().num_params();
  EXPECT_DOUBLE_EQ(cpu->weights + cpu->gradients + cpu->optimizer, param_bytes);
  EXPECT_DOUBLE_EQ(gpu.weights + gpu.gradients + gpu.optimizer, param_bytes);

  const double cpu_ratio = measured / cpu->allocated();
  const double gpu_ratio = measured / gpu.allocated();
  std::printf("[memory] %-5s B=%d K=%d: measured %.0f B, CPU-backend model %.0f B (%.4fx), "
              "GPU formula %.0f B (%.4fx; activations %.0f + logits %.0f + workspace %.0f vs "
              "%.0f + %.0f + %.0f)\n",
              c.preset, c.micro_batch, c.num_micro_batches, measured, cpu->allocated(),
              cpu_ratio, gpu.allocated(), gpu_ratio, gpu.activations, gpu.embedding_and_logits,
              gpu.workspace, cpu->activations, cpu->embedding_and_logits, cpu->workspace);
  EXPECT_NEAR(cpu_ratio, 1.0, 0.10) << "measured " << measured << " B, predicted "
                                    << cpu->allocated() << " B";
}

INSTANTIATE_TEST_SUITE_P(TinyAndSmall, CpuMemoryValidationTest,
                         ::testing::Values(Case{"tiny", 1, 1}, Case{"tiny", 4, 2},
                                           Case{"tiny", 8, 1}, Case{"small", 1, 2},
                                           Case{"small", 2, 1}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.preset) + "_b" +
                                  std::to_string(info.param.micro_batch) + "_k" +
                                  std::to_string(info.param.num_micro_batches);
                         });

// The variant refuses what the CPU backend does not run.
TEST(CpuBackendMemoryTest, RefusesLayoutsTheCpuBackendDoesNotRun) {
  const ModelShape m = *ResolvePreset("tiny");
  Layout tp;
  tp.tp = 2;
  EXPECT_EQ(CpuBackendMemory(m, Precision::kFp32, tp).status().code(),
            absl::StatusCode::kInvalidArgument);
  Layout plain;
  EXPECT_EQ(CpuBackendMemory(m, Precision::kBf16, plain).status().code(),
            absl::StatusCode::kInvalidArgument);
  Layout recompute;
  recompute.recompute = Recompute::kFull;
  EXPECT_FALSE(CpuBackendMemory(m, Precision::kFp32, recompute).ok());
}

// Hand-computed: tiny (L=2, h=64, a=4, s=64, V=256), b=1: P = 2·(12·64² + 13·64) + 256·64 +
// 64·64 + 2·64 = 120,576; activations 2·4·(18·4096 + 4·64 + 4·64²) = 722,944; logits
// 4·(2·4096 + 4·64 + 3·64·256) + 16·64 = 231,424; workspace 4·(14·4096 + 4·4096) = 294,912.
TEST(CpuBackendMemoryTest, TinyByComponent) {
  Layout l;
  const MemoryBreakdown r = *CpuBackendMemory(*ResolvePreset("tiny"), Precision::kFp32, l);
  EXPECT_DOUBLE_EQ(r.weights, 4.0 * 120'576);
  EXPECT_DOUBLE_EQ(r.optimizer, 8.0 * 120'576);
  EXPECT_DOUBLE_EQ(r.activations, 722'944);
  EXPECT_DOUBLE_EQ(r.embedding_and_logits, 231'424);
  EXPECT_DOUBLE_EQ(r.workspace, 294'912);
  EXPECT_DOUBLE_EQ(r.comm_buffers, 0);
  l.dp = 2;
  EXPECT_DOUBLE_EQ(CpuBackendMemory(*ResolvePreset("tiny"), Precision::kFp32, l)->comm_buffers,
                   4.0 * 120'576);
}

}  // namespace
}  // namespace loom::planner
