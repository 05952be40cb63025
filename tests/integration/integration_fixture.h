// The gtest fixture of the integration tests: a fresh cluster per test (loomd + two workers
// with two CPU devices each), job specs for test_rank, and readers of test_rank's files.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/integration/cluster.h"

namespace loom::testing {

// What a job of test_rank does (see test_rank.cc for the variables these become).
struct TestJob {
  std::string name = "it";
  int devices = 4;
  int steps = 5;
  int step_ms = 100;
  int max_restarts = 0;
  double backoff_seconds = 0.1;
  int crash_rank = -1;
  std::string crash_mode = "signal";
  int crash_generations = 1 << 20;
  bool ignore_term = false;
};

// One .started file of test_rank.
struct StartedRank {
  int rank = -1;
  pid_t pid = 0;
  nlohmann::json json;  // the whole file: the rank environment as the rank saw it
};

class IntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  // The cluster each test gets; fixtures override it (e.g. loomd flags).
  virtual ClusterOptions Options() const { return {}; }

  // The YAML spec of `job` (model tiny, builtin data, cpu devices, the env for test_rank).
  std::string JobYaml(const TestJob& job) const;
  // Writes the spec and submits it with `loomctl submit` plus `extra_args`; on exit code 0
  // returns the job name (the first line of stdout), otherwise the loomctl result as an error.
  absl::StatusOr<std::string> Submit(const TestJob& job,
                                     const std::vector<std::string>& extra_args = {});

  std::vector<StartedRank> Started(int generation) const;
  bool Done(int generation, int rank) const;
  // Waits until `count` ranks of `generation` have started.
  bool WaitForStarted(int generation, int count, absl::Duration timeout) const;
  // Waits until none of `pids` runs.
  bool WaitForGone(const std::vector<pid_t>& pids, absl::Duration timeout) const;

  // `loomctl ... -o json` parsed (a failure is recorded when loomctl fails or prints no JSON).
  nlohmann::json LoomctlJson(const std::vector<std::string>& args);

  std::unique_ptr<Cluster> cluster_;
};

}  // namespace loom::testing
