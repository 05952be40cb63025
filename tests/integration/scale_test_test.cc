// The scaling sweep end to end (issue 12, part 5): loomd runs copies of a tiny job at 1, 2 and 4
// CPU devices through the real scheduler, one size at a time, with real loom-train ranks;
// `loomctl scale-test` prints the table and writes the SVG; the sweep stays queryable through
// ScalingService (every size measured, the buckets summing to the lost time within 5 % of the
// step), its copies are ordinary jobs marked with it, and loomd's /metrics carries
// loom_scaling_efficiency_ratio for each size. Bad --devices are refused before anything runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "loom/v1/scaling.grpc.pb.h"
#include "tests/integration/cluster.h"

namespace loom::testing {
namespace {

using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ScaleTestIntegration, SweepOverOneTwoFourCpuDevices) {
  Cluster cluster(ClusterOptions{
      .workers = 1, .cpu_devices_per_worker = 4, .rank_program = "loom-train", .secure = false});
  const absl::Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started;
  const std::string spec =
      cluster.WriteFile("job.yaml",
                        "name: scale-tiny\n"
                        "model: {preset: tiny}\n"
                        "data: {builtin: tiny-corpus}\n"
                        "train: {steps: 1000, global_batch_tokens: 4096, lr: 1.0e-3}\n"
                        "resources: {cpu_devices: 4}\n"
                        "parallelism: {data: 4, micro_batch: 4}\n"
                        "env: {OMP_NUM_THREADS: 1, OPENBLAS_NUM_THREADS: 1}\n");

  // Bad sizes: refused by loomctl (the flag) or by loomd (the cluster), nothing created.
  CommandResult bad = cluster.Loomctl({"scale-test", "-f", spec, "--devices", "2,1"});
  EXPECT_EQ(bad.exit_code, 2) << bad.Describe();
  EXPECT_THAT(bad.err, HasSubstr("--devices: 1 after 2"));
  bad = cluster.Loomctl({"scale-test", "-f", spec, "--devices", "1,2,8"});
  EXPECT_EQ(bad.exit_code, 2) << bad.Describe();
  EXPECT_THAT(bad.err, HasSubstr("devices[2] is 8 but the cluster has 4 CPU devices"));
  bad = cluster.Loomctl({"scale-test", "-f", spec, "--devices", "1,3"});
  EXPECT_EQ(bad.exit_code, 2) << bad.Describe();
  EXPECT_THAT(bad.err, HasSubstr("at 3 devices (devices[1])"));

  const std::string plot = cluster.dir() + "/scaling.svg";
  const CommandResult run = cluster.Loomctl(
      {"scale-test", "-f", spec, "--devices", "1,2,4", "--steps", "16", "--plot", plot},
      absl::Seconds(120));
  ASSERT_EQ(run.exit_code, 0) << run.Describe() << cluster.LogTails();
  EXPECT_THAT(run.out, HasSubstr("SCALE_TEST_SUCCEEDED"));
  EXPECT_THAT(run.out, HasSubstr("EFFICIENCY"));
  EXPECT_THAT(run.out, HasSubstr("dp4 tp1 pp1"));
  const size_t at = run.err.find("scaletests/");
  ASSERT_NE(at, std::string::npos) << run.err;
  const std::string name = run.err.substr(at, run.err.find(':', at) - at);

  // The sweep as loomd keeps it.
  auto stub = v1::ScalingService::NewStub(cluster.channel());
  grpc::ClientContext context;
  v1::GetScaleTestRequest get;
  get.set_name(name);
  v1::ScaleTest test;
  ASSERT_TRUE(stub->GetScaleTest(&context, get, &test).ok());
  ASSERT_EQ(test.state(), v1::SCALE_TEST_SUCCEEDED) << test.state_reason();
  ASSERT_EQ(test.points_size(), 3);
  for (const v1::ScalePoint& p : test.points()) {
    SCOPED_TRACE(absl::StrCat(p.devices(), " devices"));
    ASSERT_TRUE(p.measured());
    EXPECT_EQ(p.ranks_size(), p.devices());
    EXPECT_EQ(p.layout().data(), p.devices());
    EXPECT_EQ(p.global_batch_tokens(), 4096);  // strong scaling: the batch stays
    EXPECT_GE(p.measured_steps(), 6);
    EXPECT_GT(p.tokens_per_second(), 0);
    // The buckets sum to the lost time within 5 % of the step.
    const v1::ScalingLoss& l = p.loss();
    EXPECT_NEAR(l.comm_exposed() + l.bubble() + l.imbalance() + l.rest(), l.lost_seconds(),
                0.05 * p.step_seconds())
        << test.DebugString();
    EXPECT_NEAR(p.efficiency(), p.ideal_step_seconds() / p.step_seconds(), 1e-9);
    // The copy is an ordinary job of the sweep.
    absl::StatusOr<v1::Job> copy = cluster.GetJob(p.job());
    ASSERT_TRUE(copy.ok()) << copy.status();
    EXPECT_EQ(copy->scale_test(), name);
    EXPECT_EQ(copy->state(), v1::SUCCEEDED);
    EXPECT_EQ(copy->spec().name(), absl::StrCat("scale-tiny-scale-", p.devices()));
  }
  EXPECT_DOUBLE_EQ(test.points(0).efficiency(), 1.0);

  // JSON output of the same sweep is the message; a SCALING finding, when raised, says where.
  for (const v1::Finding& f : test.findings()) {
    EXPECT_EQ(f.kind(), v1::SCALING);
    EXPECT_THAT(f.summary(), HasSubstr("most of it to"));
    EXPECT_FALSE(f.fix().empty());
  }

  // The plot is well-formed SVG with one point per size.
  const CommandResult xml = RunCommand({"/usr/bin/python3", "-c",
                                        "import sys, xml.dom.minidom\n"
                                        "d = xml.dom.minidom.parse(sys.argv[1])\n"
                                        "assert d.documentElement.tagName == 'svg'\n"
                                        "print(len(d.getElementsByTagName('circle')))\n",
                                        plot},
                                       absl::Seconds(20));
  EXPECT_EQ(xml.exit_code, 0) << xml.Describe();
  EXPECT_EQ(xml.out, "3\n");

  // The metric on loomd's /metrics.
  const nlohmann::json ready =
      nlohmann::json::parse(ReadAll(cluster.dir() + "/loomd-1.ready"), nullptr, false);
  ASSERT_FALSE(ready.is_discarded());
  const CommandResult metrics = RunCommand(
      {"/usr/bin/python3", "-c",
       "import sys, urllib.request\n"
       "print(urllib.request.urlopen('http://' + sys.argv[1] + '/metrics').read().decode())\n",
       ready.value("metrics", "")},
      absl::Seconds(20));
  ASSERT_EQ(metrics.exit_code, 0) << metrics.Describe();
  for (int d : {1, 2, 4}) {
    EXPECT_THAT(metrics.out,
                ::testing::ContainsRegex(absl::StrCat(
                    "loom_scaling_efficiency_ratio\\{(devices=\"", d,
                    "\",job=\"scale-tiny\"|job=\"scale-tiny\",devices=\"", d, "\")\\} ")))
        << metrics.out;
  }

  // An ended sweep cannot be cancelled.
  grpc::ClientContext cancel_context;
  v1::CancelScaleTestRequest cancel;
  cancel.set_name(name);
  v1::ScaleTest cancelled;
  EXPECT_EQ(stub->CancelScaleTest(&cancel_context, cancel, &cancelled).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  cluster.Shutdown(/*keep_dir=*/HasFailure());
}

// Polls GetScaleTest until `done` holds (returned) or 60 s pass (the last one seen).
v1::ScaleTest WaitFor(Cluster& cluster, const std::string& name,
                      const std::function<bool(const v1::ScaleTest&)>& done) {
  v1::ScaleTest test;
  const absl::Time end = absl::Now() + absl::Seconds(60);
  while (absl::Now() < end) {
    auto stub = v1::ScalingService::NewStub(cluster.channel());
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::GetScaleTestRequest get;
    get.set_name(name);
    if (stub->GetScaleTest(&context, get, &test).ok() && done(test)) return test;
    absl::SleepFor(absl::Milliseconds(200));
  }
  return test;
}

// A cancelled sweep cancels its running copy; a loomd killed mid-sweep marks the sweep FAILED
// with the reason when it starts again (never silently lost) and cancels the copy.
TEST(ScaleTestIntegration, CancelAndLoomdRestartEndTheRunningCopy) {
  Cluster cluster(ClusterOptions{
      .workers = 1, .cpu_devices_per_worker = 2, .rank_program = "loom-train", .secure = false});
  ASSERT_TRUE(cluster.Start().ok());
  v1::CreateScaleTestRequest create;
  v1::JobSpec* spec = create.mutable_spec();
  spec->set_name("long");
  spec->mutable_model()->set_preset("tiny");
  spec->mutable_data()->set_builtin("tiny-corpus");
  spec->mutable_train()->set_steps(1);
  spec->mutable_resources()->set_cpu_devices(2);
  spec->mutable_parallelism()->mutable_auto_();
  create.add_devices(1);
  create.add_devices(2);
  create.set_steps(10000);  // runs far longer than the test
  auto running_copy = [](const v1::ScaleTest& t) {
    return t.points_size() > 0 && t.points(0).job_state() == v1::RUNNING;
  };

  std::string names[2];
  for (std::string& name : names) {
    auto stub = v1::ScalingService::NewStub(cluster.channel());
    grpc::ClientContext context;
    v1::ScaleTest created;
    const grpc::Status s = stub->CreateScaleTest(&context, create, &created);
    ASSERT_TRUE(s.ok()) << s.error_message();
    name = created.name();
    if (&name == &names[0]) {
      const v1::ScaleTest t = WaitFor(cluster, name, running_copy);
      ASSERT_TRUE(running_copy(t)) << t.DebugString();
      grpc::ClientContext cancel_context;
      v1::CancelScaleTestRequest cancel;
      cancel.set_name(name);
      v1::ScaleTest cancelled;
      ASSERT_TRUE(stub->CancelScaleTest(&cancel_context, cancel, &cancelled).ok());
      EXPECT_EQ(cancelled.state(), v1::SCALE_TEST_CANCELLED);
      EXPECT_THAT(cancelled.state_reason(), HasSubstr("was cancelled"));
      absl::StatusOr<v1::Job> copy = cluster.GetJob(t.points(0).job());
      ASSERT_TRUE(copy.ok());
      EXPECT_EQ(copy->state(), v1::CANCELLED);
    }
  }
  const v1::ScaleTest before = WaitFor(cluster, names[1], running_copy);
  ASSERT_TRUE(running_copy(before)) << before.DebugString();

  const int port = cluster.loomd_port();
  cluster.loomd().Kill();  // SIGKILL mid-sweep
  ASSERT_TRUE(cluster.StartLoomd(port).ok()) << cluster.LogTails();
  const v1::ScaleTest after = WaitFor(cluster, names[1], [](const v1::ScaleTest& t) {
    return t.state() != v1::SCALE_TEST_RUNNING;
  });
  EXPECT_EQ(after.state(), v1::SCALE_TEST_FAILED) << after.DebugString();
  EXPECT_THAT(after.state_reason(), HasSubstr("loomd restarted while the sweep ran at 1 devices"));
  absl::StatusOr<v1::Job> copy = cluster.GetJob(before.points(0).job());
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(copy->state(), v1::CANCELLED);
  // The cancelled sweep is still there, as it ended.
  EXPECT_EQ(WaitFor(cluster, names[0], [](const v1::ScaleTest&) { return true; }).state(),
            v1::SCALE_TEST_CANCELLED);
  cluster.Shutdown(/*keep_dir=*/HasFailure());
}

}  // namespace
}  // namespace loom::testing
