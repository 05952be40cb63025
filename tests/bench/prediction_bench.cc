// The first prediction on a fresh cluster (issue 12, part 7): the demo's job (examples/demo.yaml)
// submitted to a fresh local cluster like the demo's (loomd, two workers of one CPU device each,
// real loom-train ranks), once with the workers' device measurement off (the planner's catalog)
// and once with it on (the figures the workers measured), one after the other in one run. For
// each it prints the plan's predicted step, the measured median (PlanCheck) and their ratio,
// and the measured and predicted phases.
//
// Run: build/bin/prediction_bench [rounds] (after scripts/build.sh; each round starts two fresh
// clusters; about a minute per round). The source tree's examples/demo.yaml is used.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "tests/integration/cluster.h"

namespace {

using loom::testing::Cluster;
using loom::testing::ClusterOptions;
using loom::testing::CommandResult;

int RunOnce(bool measure, const std::string& spec) {
  Cluster cluster(ClusterOptions{.workers = 2,
                                 .cpu_devices_per_worker = 1,
                                 .rank_program = "loom-train",
                                 .measure_devices = measure});
  if (absl::Status st = cluster.Start(); !st.ok()) {
    std::fprintf(stderr, "prediction_bench: cluster: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  const std::string file = cluster.WriteFile("demo.yaml", spec);
  const CommandResult submit = cluster.Loomctl({"submit", "-f", file});
  if (submit.exit_code != 0) {
    std::fprintf(stderr, "prediction_bench: submit: %s\n", submit.Describe().c_str());
    return 1;
  }
  const std::string job = submit.out.substr(0, submit.out.find('\n'));
  absl::StatusOr<loom::v1::Job> done = cluster.WaitForJob(
      job, [](const loom::v1::Job& j) { return j.state() == loom::v1::SUCCEEDED; },
      absl::Minutes(5));
  if (!done.ok() || !done->has_plan() || !done->has_plan_check()) {
    std::fprintf(stderr, "prediction_bench: %s: %s\n%s", job.c_str(),
                 std::string(done.status().message()).c_str(), cluster.LogTails().c_str());
    return 1;
  }
  const loom::v1::Plan& plan = done->plan();
  const loom::v1::PlanCheck& check = done->plan_check();
  std::printf(
      "%-9s predicted %.4f s/step, measured %.4f s/step (median of %d), measured/predicted "
      "%.2f; calibration %s\n",
      measure ? "measured" : "catalog", plan.step_seconds(), check.measured_step_seconds(),
      check.measured_steps(), check.measured_step_seconds() / plan.step_seconds(),
      plan.calibration().device_model().c_str());
  std::printf("          predicted phases: forward %.4f backward %.4f optimizer %.4f\n",
              plan.phases().forward(), plan.phases().backward(), plan.phases().optimizer());
  cluster.Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 1;
  if (argc > 1 && (!absl::SimpleAtoi(argv[1], &rounds) || rounds < 1)) {
    std::fprintf(stderr, "usage: prediction_bench [rounds]\n");
    return 2;
  }
  std::ifstream in(LOOM_SOURCE_DIR "/examples/demo.yaml");
  std::stringstream spec;
  spec << in.rdbuf();
  if (spec.str().empty()) {
    std::fprintf(stderr, "prediction_bench: cannot read examples/demo.yaml\n");
    return 1;
  }
  for (int r = 0; r < rounds; ++r) {
    for (bool measure : {false, true}) {
      if (int rc = RunOnce(measure, spec.str()); rc != 0) return rc;
    }
  }
  return 0;
}
