// The planner's use of figures measured on the nodes (server/planner/measured_peaks.h): the fit
// recovers a device whose figures are known, falls back when a fit is not physical, and bad
// figures are refused naming the field.
#include "server/planner/measured_peaks.h"

#include <cmath>
#include <functional>
#include <limits>
#include <tuple>

#include "gtest/gtest.h"
#include "server/planner/memory_model.h"
#include "server/planner/time_model.h"

namespace loom::planner {
namespace {

ModelShape Shape(int layers, int hidden, int heads, int seq, int vocab) {
  ModelShape m;
  m.name = "custom";
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.seq_len = seq;
  m.vocab = vocab;
  return m;
}

// A CPU device whose figures differ from the catalog's in every way the fit can see.
DeviceSpec TrueDevice() {
  DeviceSpec d = *DefaultDevice("cpu", 1, 1);
  d.peak_flops = 80e9;
  d.efficiency.gemm_small = 0.25;
  d.efficiency.gemm_medium = 0.5;
  d.efficiency.gemm_large = 0.7;
  d.memory_bandwidth_bytes_per_s = 3e9;
  d.efficiency.memory_bandwidth = 1.0;
  d.efficiency.block_overhead_s = 400e-6;
  return d;
}

// What loom-train --measure-device would report on TrueDevice().
MeasuredPeaks MeasurementOf(const DeviceSpec& d, double optimizer_bytes_per_s) {
  MeasuredPeaks m;
  for (int width : {64, 256, 1024}) {
    m.gemm.push_back({1024, width, width, EffectiveFlops(d, Precision::kFp32, width)});
  }
  for (auto [h, nh, s, b] : {std::tuple{64, 4, 64, 16}, std::tuple{256, 4, 128, 4}}) {
    Layout l;
    l.micro_batch = b;
    const BlockTime t = BlockCost(Shape(1, h, nh, s, 64), Precision::kFp32, l, d);
    m.blocks.push_back({h, nh, s, b, t.forward + t.backward});
  }
  m.optimizer_bytes_per_s = optimizer_bytes_per_s;
  return m;
}

TEST(MeasuredPeaksTest, TheFitRecoversTheDeviceThatWasMeasured) {
  const DeviceSpec truth = TrueDevice();
  const DeviceSpec fitted =
      ApplyMeasuredPeaks(*DefaultDevice("cpu", 1, 1), MeasurementOf(truth, 2e9));
  EXPECT_TRUE(fitted.measured);
  EXPECT_NEAR(fitted.peak_flops, 56e9, 1e3);  // the fastest class: 0.7 x 80e9
  for (double dim : {64.0, 256.0, 4096.0}) {
    EXPECT_NEAR(EffectiveFlops(fitted, Precision::kFp32, dim),
                EffectiveFlops(truth, Precision::kFp32, dim), 1e3)
        << dim;
  }
  EXPECT_NEAR(fitted.memory_bandwidth_bytes_per_s * fitted.efficiency.memory_bandwidth, 3e9, 1e3);
  EXPECT_NEAR(fitted.efficiency.block_overhead_s, 400e-6, 1e-9);
  // The optimizer runs at its own measured rate: 28 bytes per parameter.
  Layout one;
  one.micro_batch = 4;
  one.num_micro_batches = 2;
  const ModelShape model = Shape(4, 128, 4, 64, 256);
  const StepTime step = EstimateStep(model, Precision::kFp32, one, fitted, {4});
  const double params = 4 * BlockParams(model, 1) + StageExtraParams(model, one, 0);
  EXPECT_NEAR(step.optimizer, params * 28 / 2e9, 1e-9);
  // And a whole step of another model is predicted as the true device would run it.
  DeviceSpec truth_opt = truth;
  truth_opt.efficiency.optimizer_bandwidth = 2e9 / 3e9;
  const StepTime want = EstimateStep(model, Precision::kFp32, one, truth_opt, {4});
  EXPECT_NEAR(step.total, want.total, want.total * 1e-9);
}

TEST(MeasuredPeaksTest, AFitThatIsNotPhysicalFallsBackToNoOverhead) {
  DeviceSpec truth = TrueDevice();
  MeasuredPeaks m = MeasurementOf(truth, 0);
  // The wider block measured faster than its GEMMs alone allow for the smaller one's slope: the
  // least-squares slope comes out negative.
  m.blocks[0].seconds *= 40;
  const DeviceSpec fitted = ApplyMeasuredPeaks(*DefaultDevice("cpu", 1, 1), m);
  EXPECT_EQ(fitted.efficiency.block_overhead_s, 0);
  EXPECT_GT(fitted.memory_bandwidth_bytes_per_s, 0);
  EXPECT_TRUE(std::isfinite(fitted.memory_bandwidth_bytes_per_s));
  // The bandwidth explains the slowest sample (per byte) entirely.
  Layout l;
  l.micro_batch = m.blocks[0].micro_batch;
  const BlockTime t = BlockCost(Shape(1, 64, 4, 64, 64), Precision::kFp32, l, fitted);
  EXPECT_NEAR(t.forward + t.backward, m.blocks[0].seconds, m.blocks[0].seconds * 1e-9);
}

TEST(MeasuredPeaksTest, AClassNotMeasuredTakesTheNearestSlowerOne) {
  MeasuredPeaks m;
  m.gemm.push_back({1024, 64, 64, 10e9});      // small
  m.gemm.push_back({1024, 1024, 1024, 30e9});  // large; medium missing: min of both neighbours
  const DeviceSpec fitted = ApplyMeasuredPeaks(*DefaultDevice("cpu", 1, 1), m);
  EXPECT_NEAR(EffectiveFlops(fitted, Precision::kFp32, 300), 10e9, 1);
  EXPECT_NEAR(EffectiveFlops(fitted, Precision::kFp32, 2000), 30e9, 1);
}

TEST(MeasuredPeaksTest, WithoutGemmSamplesTheCatalogStays) {
  const DeviceSpec catalog = *DefaultDevice("cpu", 1, 1);
  const DeviceSpec d = ApplyMeasuredPeaks(catalog, MeasuredPeaks{});
  EXPECT_FALSE(d.measured);
  EXPECT_EQ(d.peak_flops, catalog.peak_flops);
  EXPECT_EQ(CalibrationKey(d), "cpu");
}

TEST(MeasuredPeaksTest, MeasuredDevicesAreCalibratedApart) {
  const DeviceSpec d =
      ApplyMeasuredPeaks(*DefaultDevice("cpu", 1, 1), MeasurementOf(TrueDevice(), 0));
  EXPECT_EQ(CalibrationKey(d), "cpu@measured");
}

TEST(MeasuredPeaksTest, RanksOfOneNodeShareItsMeasuredCores) {
  const MeasuredPeaks m = MeasurementOf(TrueDevice(), 2e9);
  const DeviceSpec one_node = ApplyMeasuredPeaks(*DefaultDevice("cpu", 2, 2), m);
  const DeviceSpec two_nodes = ApplyMeasuredPeaks(*DefaultDevice("cpu", 2, 1), m);
  ASSERT_TRUE(one_node.shares_node_compute);
  Layout l;
  l.dp = 2;
  l.micro_batch = 4;
  const ModelShape model = Shape(2, 64, 4, 64, 256);
  const StepTime shared = EstimateStep(model, Precision::kFp32, l, one_node, {2});
  const StepTime alone = EstimateStep(model, Precision::kFp32, l, two_nodes, {2});
  EXPECT_NEAR(shared.forward, 2 * alone.forward, alone.forward * 1e-9);
  EXPECT_NEAR(shared.optimizer, 2 * alone.optimizer, alone.optimizer * 1e-9);
  // The catalog's devices are not affected (calibration absorbs the sharing there).
  const DeviceSpec catalog = *DefaultDevice("cpu", 2, 2);
  EXPECT_FALSE(catalog.shares_node_compute);
}

TEST(MeasuredPeaksTest, BadFiguresAreRefusedNamingTheField) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  MeasuredPeaks good = MeasurementOf(TrueDevice(), 2e9);
  EXPECT_TRUE(ValidateMeasuredPeaks(good).ok());
  EXPECT_TRUE(ValidateMeasuredPeaks(MeasuredPeaks{}).ok());
  struct Case {
    std::function<void(MeasuredPeaks&)> spoil;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[&](MeasuredPeaks& m) { m.gemm[1].flops_per_s = nan; }, "peaks.gemm[1].flops_per_second"},
      {[&](MeasuredPeaks& m) { m.gemm[0].flops_per_s = -1; }, "peaks.gemm[0].flops_per_second"},
      {[&](MeasuredPeaks& m) { m.gemm[2].flops_per_s = 1e30; }, "peaks.gemm[2].flops_per_second"},
      {[&](MeasuredPeaks& m) { m.gemm[0].rows = 0; }, "peaks.gemm[0]"},
      {[&](MeasuredPeaks& m) { m.blocks[1].seconds = inf; }, "peaks.blocks[1].seconds"},
      {[&](MeasuredPeaks& m) { m.blocks[0].heads = 1000; }, "peaks.blocks[0]"},
      {[&](MeasuredPeaks& m) { m.optimizer_bytes_per_s = -5; }, "peaks.optimizer_bytes_per_second"},
      {[&](MeasuredPeaks& m) { m.gemm.resize(17, m.gemm[0]); }, "peaks.gemm"},
  };
  for (const Case& c : cases) {
    MeasuredPeaks m = good;
    c.spoil(m);
    const absl::Status st = ValidateMeasuredPeaks(m);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(st.message().find(c.field), absl::string_view::npos) << st.message();
  }
}

}  // namespace
}  // namespace loom::planner
