// loomd's and the workers' /metrics over real HTTP while a job runs and after it: promtool
// accepts both expositions, the series keep their names, help texts and types, and the series of
// a finished job are gone.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/integration_fixture.h"

namespace loom::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Fetches http://ADDRESS/metrics and pipes it through `promtool check metrics`: out is the
// exposition, err promtool's findings, exit_code promtool's (2 when the fetch fails).
CommandResult ScrapeAndCheck(const std::string& address) {
  return RunCommand({"/usr/bin/python3", "-c",
                     "import subprocess, sys, urllib.request\n"
                     "try:\n"
                     "  text = urllib.request.urlopen('http://' + sys.argv[1] + '/metrics',\n"
                     "                                timeout=10).read()\n"
                     "except Exception as e:\n"
                     "  sys.stderr.write('fetch failed: %s' % e); sys.exit(2)\n"
                     "p = subprocess.run(['promtool', 'check', 'metrics'], input=text,\n"
                     "                   capture_output=True)\n"
                     "sys.stdout.write(text.decode())\n"
                     "sys.stderr.write(p.stdout.decode() + p.stderr.decode())\n"
                     "sys.exit(p.returncode)\n",
                     address},
                    absl::Seconds(30));
}

// The "metrics" address of a daemon's ready file ("" when unreadable).
std::string MetricsAddress(const std::string& ready_file) {
  std::ifstream in(ready_file);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json ready = nlohmann::json::parse(text.str(), nullptr, false);
  return ready.is_discarded() ? "" : ready.value("metrics", "");
}

TEST_F(IntegrationTest, PrometheusExpositionOfLoomdAndWorkersPassesPromtool) {
  if (RunCommand({"/bin/sh", "-c", "command -v promtool"}, absl::Seconds(10)).exit_code != 0) {
    GTEST_SKIP() << "promtool is not on PATH; install the Debian package prometheus to run this";
  }
  const std::string loomd = MetricsAddress(cluster_->dir() + "/loomd-1.ready");
  const std::string worker = MetricsAddress(cluster_->dir() + "/worker-0.ready");
  ASSERT_THAT(loomd, ::testing::MatchesRegex("127\\.0\\.0\\.1:[0-9]+"));
  ASSERT_THAT(worker, ::testing::MatchesRegex("127\\.0\\.0\\.1:[0-9]+"));

  absl::StatusOr<std::string> job = Submit({.name = "scraped", .devices = 4, .steps = 50});
  ASSERT_TRUE(job.ok()) << job.status();
  // Series carry the job id without its "jobs/" prefix.
  const std::string job_label = absl::StrCat("job=\"", job->substr(job->find('/') + 1), "\"");
  // While the job runs, loomd exports its per-job series.
  CommandResult running;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  do {
    running = ScrapeAndCheck(loomd);
    ASSERT_EQ(running.exit_code, 0) << running.Describe();
    if (running.out.find("loom_job_goodput_ratio{" + job_label) != std::string::npos &&
        running.out.find("loom_jobs{state=\"RUNNING\"} 1\n") != std::string::npos) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < deadline);
  // Names, help texts and types as before prometheus-cpp (a dashboard or an alert rule depends
  // on them).
  for (const char* line : {
           "# HELP loom_jobs Jobs by state.\n# TYPE loom_jobs gauge\n",
           "# HELP loom_scheduler_queue_depth Jobs waiting for devices.\n",
           "# HELP loom_rpc_requests_total RPCs served, by full method name and status code.\n"
           "# TYPE loom_rpc_requests_total counter\n",
           "# TYPE loom_scheduling_latency_seconds histogram\n",
           "loom_jobs{state=\"RUNNING\"} 1\n",
           "loom_nodes{state=\"READY\"} 2\n",
           "loom_devices{kind=\"cpu\",state=\"allocated\"} 4\n",
           "loom_scheduling_latency_seconds_count 1\n",
       }) {
    EXPECT_THAT(running.out, HasSubstr(line));
  }
  EXPECT_THAT(running.out, HasSubstr("loom_job_goodput_ratio{" + job_label + "} "));

  const CommandResult node = ScrapeAndCheck(worker);
  ASSERT_EQ(node.exit_code, 0) << node.Describe();
  for (const char* line : {
           "# HELP loom_worker_launches_total Rank processes launched by this worker.\n"
           "# TYPE loom_worker_launches_total counter\n",
           "loom_node_devices{kind=\"cpu\"} 2\n",
           "loom_worker_session_connected 1\n",
       }) {
    EXPECT_THAT(node.out, HasSubstr(line));
  }

  const CommandResult watch = cluster_->Loomctl({"watch", *job});
  ASSERT_EQ(watch.exit_code, 0) << watch.Describe();
  // The finished job's series are removed at the next scrape.
  const CommandResult after = ScrapeAndCheck(loomd);
  ASSERT_EQ(after.exit_code, 0) << after.Describe();
  EXPECT_THAT(after.out, Not(HasSubstr(job_label)));
  EXPECT_THAT(after.out, HasSubstr("loom_jobs{state=\"SUCCEEDED\"} 1\n"));
  const CommandResult node_after = ScrapeAndCheck(worker);
  ASSERT_EQ(node_after.exit_code, 0) << node_after.Describe();
  EXPECT_THAT(node_after.out, HasSubstr("loom_worker_rank_exits_total{reason=\"success\"} 2\n"));
}

}  // namespace
}  // namespace loom::testing
