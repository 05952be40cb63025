// loom_scaling_efficiency_ratio{job, devices} (server/metrics/server_metrics.h): only the latest
// sweep of a job name is exported, and the job names are bounded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "common/metrics.h"
#include "server/metrics/server_metrics.h"
#include "server/scaling/scale_test_manager.h"

namespace loom::server_metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ScalingEfficiencyMetric, LatestSweepPerJobNameReplacesTheOldSeries) {
  metrics::Registry registry;
  ServerMetrics m(&registry);
  m.SetScalingEfficiency("demo", {{1, 1.0}, {2, 0.8}, {4, 0.5}});
  std::string text = registry.Serialize();
  EXPECT_THAT(text, HasSubstr("loom_scaling_efficiency_ratio{devices=\"4\",job=\"demo\"} 0.5"));
  m.SetScalingEfficiency("demo", {{1, 1.0}, {2, 0.9}});
  text = registry.Serialize();
  EXPECT_THAT(text, HasSubstr("loom_scaling_efficiency_ratio{devices=\"2\",job=\"demo\"} 0.9"));
  EXPECT_THAT(text, Not(HasSubstr("devices=\"4\",job=\"demo\"")));
}

TEST(ScalingEfficiencyMetric, AtMostAHundredJobNamesTheLeastRecentlySweptDropped) {
  metrics::Registry registry;
  ServerMetrics m(&registry);
  for (int i = 0; i <= static_cast<int>(ServerMetrics::kMaxScalingJobs); ++i) {
    m.SetScalingEfficiency("job-" + std::to_string(i), {{1, 1.0}});
  }
  const std::string text = registry.Serialize();
  EXPECT_THAT(text, Not(HasSubstr("job=\"job-0\"")));
  EXPECT_THAT(text, HasSubstr("job=\"job-1\""));
  EXPECT_THAT(text, HasSubstr("job=\"job-100\""));
}

}  // namespace
}  // namespace loom::server_metrics

namespace loom::scaling {
namespace {

// Two tenants' sweeps of jobs with the same name each keep their own series.
TEST(ScalingEfficiencyMetric, TheJobLabelKeepsTenantsApart) {
  v1::ScaleTest test;
  test.mutable_spec()->set_name("gpt2");
  EXPECT_EQ(ScalingMetricJob(test), "gpt2");  // stored before tenants existed
  test.set_tenant("default");
  EXPECT_EQ(ScalingMetricJob(test), "gpt2");
  test.set_tenant("team-b");
  EXPECT_EQ(ScalingMetricJob(test), "team-b/gpt2");
  test.mutable_spec()->clear_name();
  EXPECT_EQ(ScalingMetricJob(test), "team-b/job");
}

}  // namespace
}  // namespace loom::scaling
