// loomctl scale-test's pure parts: the --devices flag, the table and the SVG figure.
#include "client/scale_test_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "client/scale_plot.h"

namespace loom::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ParseDevicesFlag, StrictList) {
  absl::StatusOr<std::vector<int>> ok = ParseDevicesFlag("1,2,4,8");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, (std::vector<int>{1, 2, 4, 8}));
  const std::pair<const char*, const char*> bad[] = {
      {"", "--devices is required"},      {"1,,2", "\"\" is not a positive device count"},
      {"1,x", "\"x\" is not a positive"}, {"0,1", "\"0\" is not a positive"},
      {"1,-2", "\"-2\" is not"},          {"2,1", "--devices: 1 after 2"},
      {"1,1", "strictly increasing"},     {"1,2,3,4,5,6,7,8,9", "at most 8"},
      {"1.5", "\"1.5\" is not"},
  };
  for (const auto& [text, message] : bad) {
    const absl::StatusOr<std::vector<int>> r = ParseDevicesFlag(text);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(r.status().message(), HasSubstr(message)) << text;
  }
}

loom::v1::ScaleTest Finished() {
  loom::v1::ScaleTest t;
  t.set_name("scaletests/abc");
  t.mutable_spec()->set_name("a&b<c>");
  t.set_state(loom::v1::SCALE_TEST_SUCCEEDED);
  t.set_steps(20);
  t.set_efficiency_threshold(0.7);
  const double steps[] = {1.0, 0.7, 0.5};
  const int devices[] = {1, 2, 4};
  for (int i = 0; i < 3; ++i) {
    loom::v1::ScalePoint* p = t.add_points();
    p->set_devices(devices[i]);
    p->set_measured(true);
    p->set_step_seconds(steps[i]);
    p->set_ideal_step_seconds(1.0 / devices[i]);
    p->set_efficiency(1.0 / devices[i] / steps[i]);
    p->set_tokens_per_second(1000 / steps[i]);
    p->set_job("jobs/j" + std::to_string(i));
    p->mutable_loss()->set_lost_seconds(steps[i] - 1.0 / devices[i]);
    p->mutable_loss()->set_comm_exposed(0.1 * i);
    p->mutable_loss()->set_rest(-0.01);  // negative buckets are not stacked
    p->mutable_loss()->set_unexplained(0.02);
  }
  loom::v1::Finding* f = t.add_findings();
  f->set_kind(loom::v1::SCALING);
  f->set_severity(loom::v1::FINDING_SEVERITY_WARNING);
  f->set_subject("4 devices");
  f->set_summary("scaling efficiency 0.50 at 4 devices");
  f->set_fix("overlap on");
  return t;
}

TEST(FormatScaleTest, RowsPerSizeAndFindings) {
  const std::string table = FormatScaleTest(Finished());
  EXPECT_THAT(table, HasSubstr("EFFICIENCY"));
  EXPECT_THAT(table, HasSubstr("0.500"));
  EXPECT_THAT(table, HasSubstr("jobs/j2"));
  EXPECT_THAT(table, HasSubstr("SCALING (4 devices)"));
  EXPECT_THAT(table, HasSubstr("fix: overlap on"));
}

TEST(ScalingSvg, OnePointPerSizeEscapedText) {
  const std::string svg = ScalingSvg(Finished());
  EXPECT_THAT(svg, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_THAT(svg, HasSubstr("a&amp;b&lt;c&gt;"));
  EXPECT_THAT(svg, Not(HasSubstr("a&b")));
  size_t circles = 0;
  for (size_t at = svg.find("<circle"); at != std::string::npos; at = svg.find("<circle", at + 1))
    ++circles;
  EXPECT_EQ(circles, 3u);
  EXPECT_THAT(svg, HasSubstr("4 devices, exposed communication: 0.2000 s"));
  EXPECT_THAT(svg, Not(HasSubstr("compute inflation: -")));
  EXPECT_THAT(svg, HasSubstr("</svg>"));
}

}  // namespace
}  // namespace loom::client
