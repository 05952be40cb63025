// The search on CPU devices uses the CPU backend's exact memory (cpu_backend_memory.h), and the
// calibrated efficiency table (ScaleEfficiency) scales predicted compute and communication
// exactly; plan_mapping carries the calibration into every plan of loomd, and none offline.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/planner/cpu_backend_memory.h"
#include "server/planner/device_spec.h"
#include "server/planner/layout_evaluator.h"
#include "server/planner/layout_search.h"
#include "server/planner/memory_model.h"
#include "server/planner/model_shape.h"
#include "server/planner/time_model.h"
#include "server/planner_service/plan_mapping.h"

namespace loom::planner {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

void ExpectSameBreakdown(const MemoryBreakdown& a, const MemoryBreakdown& b) {
  EXPECT_DOUBLE_EQ(a.weights, b.weights);
  EXPECT_DOUBLE_EQ(a.gradients, b.gradients);
  EXPECT_DOUBLE_EQ(a.optimizer, b.optimizer);
  EXPECT_DOUBLE_EQ(a.activations, b.activations);
  EXPECT_DOUBLE_EQ(a.embedding_and_logits, b.embedding_and_logits);
  EXPECT_DOUBLE_EQ(a.comm_buffers, b.comm_buffers);
  EXPECT_DOUBLE_EQ(a.workspace, b.workspace);
  EXPECT_DOUBLE_EQ(a.fragmentation, b.fragmentation);
  EXPECT_DOUBLE_EQ(a.runtime_reserve, b.runtime_reserve);
  EXPECT_DOUBLE_EQ(a.total(), b.total());
}

TEST(CpuSearchMemoryTest, PlannedMemoryOfACpuJobIsTheCpuBackendsFigure) {
  for (const char* preset : {"tiny", "small"}) {
    for (int devices : {1, 2}) {
      SCOPED_TRACE(std::string(preset) + " on " + std::to_string(devices));
      PlanRequest r;
      r.model = *ResolvePreset(preset);
      r.precision = Precision::kFp32;
      r.devices = *DefaultDevice("cpu", devices, devices);
      r.batch.global_batch_sequences = 8 * devices;
      r.fixed.tp = 1;
      r.fixed.pp = 1;
      r.fixed.recompute = Recompute::kNone;
      r.fixed.zero1 = false;
      r.options.top_k = 10;
      absl::StatusOr<PlanResult> plan = PlanLayouts(r);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_FALSE(plan->ranked.empty());
      for (const Evaluation& e : plan->ranked) {
        SCOPED_TRACE(LayoutString(e.layout));
        absl::StatusOr<MemoryBreakdown> cpu = CpuBackendMemory(r.model, r.precision, e.layout);
        ASSERT_TRUE(cpu.ok()) << cpu.status();
        ExpectSameBreakdown(e.peak_memory, *cpu);
        ASSERT_EQ(e.stage_memory.size(), 1u);
        EXPECT_DOUBLE_EQ(e.headroom_bytes, r.devices.memory_bytes - cpu->total());
        // The GPU formula gives another figure: the search did not use it.
        const MemoryBreakdown gpu =
            StageMemory(r.model, r.precision, e.layout, r.devices, 0, r.model.layers);
        EXPECT_NE(gpu.total(), cpu->total());
      }
    }
  }
}

TEST(CpuSearchMemoryTest, FitIsDecidedByTheCpuBackendsFigure) {
  const ModelShape m = *ResolvePreset("small");
  Layout l;
  l.micro_batch = 4;
  l.num_micro_batches = 2;
  const double need = CpuBackendMemory(m, Precision::kFp32, l)->total();
  DeviceSpec d = *DefaultDevice("cpu", 1, 1);
  d.memory_bytes = need;  // exactly enough: no fragmentation margin on the CPU backend
  EXPECT_TRUE(EvaluateLayout(m, Precision::kFp32, d, l).fits);
  d.memory_bytes = need - 1;
  const Evaluation short_by_one = EvaluateLayout(m, Precision::kFp32, d, l);
  EXPECT_FALSE(short_by_one.fits);
  EXPECT_DOUBLE_EQ(short_by_one.headroom_bytes, -1);
  // Layouts the CPU backend does not run keep the GPU formula (with its margin).
  Layout tp = l;
  tp.tp = 2;
  tp.dp = 1;
  d = *DefaultDevice("cpu", 2, 2);
  const Evaluation gpu_formula = EvaluateLayout(m, Precision::kFp32, d, tp);
  EXPECT_GT(gpu_formula.peak_memory.fragmentation, 0);
}

TEST(ScaleEfficiencyTest, ScalesComputeAndCommunicationExactly) {
  const ModelShape m = *ResolvePreset("gpt2-124m");
  // CPU, one rank: the whole step is compute.
  {
    const DeviceSpec d = *DefaultDevice("cpu", 1, 1);
    DeviceSpec scaled = d;
    scaled.efficiency = ScaleEfficiency(d.efficiency, 7.0, 3.0);
    Layout l;
    l.micro_batch = 2;
    l.num_micro_batches = 3;
    const StepTime a = EstimateStep(m, Precision::kFp32, l, d, {m.layers});
    const StepTime b = EstimateStep(m, Precision::kFp32, l, scaled, {m.layers});
    EXPECT_NEAR(b.forward, 7.0 * a.forward, 1e-12 * b.forward);
    EXPECT_NEAR(b.backward, 7.0 * a.backward, 1e-12 * b.backward);
    EXPECT_NEAR(b.optimizer, 7.0 * a.optimizer, 1e-12 * b.optimizer);
    EXPECT_NEAR(b.total, 7.0 * a.total, 1e-12 * b.total);
    // With an optimizer scale of its own, only the optimizer moves.
    DeviceSpec split = d;
    split.efficiency = ScaleEfficiency(d.efficiency, 7.0, 3.0, 2.0);
    const StepTime c = EstimateStep(m, Precision::kFp32, l, split, {m.layers});
    EXPECT_NEAR(c.forward, 7.0 * a.forward, 1e-12 * c.forward);
    EXPECT_NEAR(c.optimizer, 2.0 * a.optimizer, 1e-12 * c.optimizer);
  }
  // GPUs with tensor, pipeline and data parallelism: communication alone.
  {
    const DeviceSpec d = *DefaultDevice("H100-SXM", 64, 8);
    DeviceSpec scaled = d;
    scaled.efficiency = ScaleEfficiency(d.efficiency, 1.0, 2.5);
    Layout l;
    l.tp = 4;
    l.pp = 4;
    l.dp = 4;
    l.micro_batch = 1;
    l.num_micro_batches = 8;
    const std::vector<int> stages = {3, 3, 3, 3};
    const StepTime a = EstimateStep(m, Precision::kBf16, l, d, stages);
    const StepTime b = EstimateStep(m, Precision::kBf16, l, scaled, stages);
    EXPECT_DOUBLE_EQ(b.forward, a.forward);
    EXPECT_DOUBLE_EQ(b.optimizer, a.optimizer);
    EXPECT_NEAR(b.tp_comm, 2.5 * a.tp_comm, 1e-12 * b.tp_comm);
    EXPECT_NEAR(b.pp_comm, 2.5 * a.pp_comm, 1e-12 * b.pp_comm);
    EXPECT_NEAR(b.dp_total, 2.5 * a.dp_total, 1e-12 * b.dp_total);
    EXPECT_GT(b.tp_comm, 0);
  }
  // Unusable scales change nothing.
  const EfficiencyTable t = DefaultDevice("cpu", 1, 1)->efficiency;
  for (double bad : {0.0, -2.0, std::nan("")}) {
    const EfficiencyTable u = ScaleEfficiency(t, bad, bad);
    EXPECT_DOUBLE_EQ(u.gemm_large, t.gemm_large);
    EXPECT_DOUBLE_EQ(u.allreduce_intra, t.allreduce_intra);
  }
}

v1::JobSpec CpuJob() {
  v1::JobSpec spec;
  spec.mutable_model()->set_preset("tiny");
  spec.mutable_resources()->set_cpu_devices(1);
  spec.mutable_parallelism()->mutable_auto_();
  return spec;
}

TEST(PlanMappingCalibrationTest, LoomdPlansCarryTheCalibrationAndOfflineOnesDoNot) {
  const DeviceSpec cluster = *DefaultDevice("cpu", 2, 2);
  absl::StatusOr<v1::PlanJobResponse> offline =
      planner_service::PlanJobOnDevices(CpuJob(), cluster, 3);
  ASSERT_TRUE(offline.ok()) << offline.status();
  EXPECT_FALSE(offline->plans(0).has_calibration());
  EXPECT_THAT(offline->plans(0).reasons(), ::testing::Not(Contains(HasSubstr("efficiency"))));

  v1::PlanCalibration c;
  c.set_device_model("cpu");
  c.set_jobs(3);
  c.set_compute_scale(7.5);
  c.set_comm_scale(1.0);
  absl::StatusOr<v1::PlanJobResponse> online =
      planner_service::PlanJobOnDevices(CpuJob(), cluster, 3, &c);
  ASSERT_TRUE(online.ok()) << online.status();
  EXPECT_EQ(online->plans(0).calibration().jobs(), 3);
  EXPECT_THAT(online->plans(0).reasons(),
              Contains(HasSubstr("efficiency calibrated from 3 finished jobs on cpu: compute "
                                 "×7.50")));
  // dp = 1 on CPUs is pure compute: the prediction is 7.5 times the catalog's.
  EXPECT_NEAR(online->plans(0).step_seconds(), 7.5 * offline->plans(0).step_seconds(),
              1e-9 * online->plans(0).step_seconds());

  // PlanJob looks the cluster's model up; a model without a calibration plans with the
  // catalog's and says so.
  v1::PlanJobRequest request;
  *request.mutable_spec() = CpuJob();
  request.mutable_spec()->mutable_resources()->set_gpus(8);
  request.mutable_spec()->mutable_resources()->set_cpu_devices(0);
  request.mutable_cluster()->set_nodes(1);
  request.mutable_cluster()->set_gpus_per_node(8);
  request.mutable_cluster()->mutable_gpu()->set_model("H100-SXM");
  absl::StatusOr<v1::PlanJobResponse> gpu = planner_service::PlanJob(request, {}, {{"cpu", c}});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->plans(0).calibration().device_model(), "H100-SXM");
  EXPECT_EQ(gpu->plans(0).calibration().jobs(), 0);
  EXPECT_THAT(gpu->plans(0).reasons(), Contains(HasSubstr("catalog's defaults for H100-SXM")));
}

}  // namespace
}  // namespace loom::planner
