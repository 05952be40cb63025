#include "tests/integration/integration_fixture.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace loom::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

}  // namespace

void IntegrationTest::SetUp() {
  cluster_ = std::make_unique<Cluster>(Options());
  const absl::Status started = cluster_->Start();
  ASSERT_TRUE(started.ok()) << started;
}

void IntegrationTest::TearDown() {
  if (!cluster_) return;
  if (HasFailure()) std::cerr << cluster_->LogTails();
  cluster_->Shutdown(/*keep_dir=*/HasFailure());
}

std::string IntegrationTest::JobYaml(const TestJob& job) const {
  std::string yaml = absl::StrCat(
      "name: ", job.name, "\n", "model: {preset: tiny}\n", "data: {builtin: tiny-corpus}\n",
      "train: {steps: ", job.steps, "}\n", "resources: {cpu_devices: ", job.devices, "}\n",
      "restart: {max_restarts: ", job.max_restarts, ", backoff_seconds: ", job.backoff_seconds,
      "}\n", "env:\n", "  TEST_RANK_OUT_DIR: ", cluster_->out_dir(), "\n",
      "  TEST_RANK_STEPS: ", job.steps, "\n", "  TEST_RANK_STEP_MS: ", job.step_ms, "\n");
  if (job.crash_rank >= 0) {
    absl::StrAppend(&yaml, "  TEST_RANK_CRASH_RANK: ", job.crash_rank, "\n",
                    "  TEST_RANK_CRASH_MODE: ", job.crash_mode, "\n",
                    "  TEST_RANK_CRASH_GENERATIONS: ", job.crash_generations, "\n");
  }
  if (job.ignore_term) absl::StrAppend(&yaml, "  TEST_RANK_IGNORE_TERM: 1\n");
  return yaml;
}

absl::StatusOr<std::string> IntegrationTest::Submit(const TestJob& job,
                                                    const std::vector<std::string>& extra_args) {
  const std::string file = cluster_->WriteFile(job.name + ".yaml", JobYaml(job));
  std::vector<std::string> args = {"submit", "-f", file};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  const CommandResult r = cluster_->Loomctl(args);
  if (r.exit_code != 0) return absl::InternalError("loomctl submit: " + r.Describe());
  const std::vector<std::string> lines = absl::StrSplit(r.out, '\n');
  return lines.front();
}

std::vector<StartedRank> IntegrationTest::Started(int generation) const {
  std::vector<StartedRank> ranks;
  const std::string prefix = absl::StrCat("gen", generation, "-rank");
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(cluster_->out_dir(), ec)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind(prefix, 0) != 0 || entry.path().extension() != ".started") continue;
    StartedRank r;
    r.json = nlohmann::json::parse(ReadFile(entry.path().string()), nullptr, false);
    if (!r.json.is_object()) continue;
    r.pid = r.json.value("pid", 0);
    r.rank = std::atoi(r.json.value("LOOM_RANK", "-1").c_str());
    ranks.push_back(std::move(r));
  }
  std::sort(ranks.begin(), ranks.end(),
            [](const StartedRank& a, const StartedRank& b) { return a.rank < b.rank; });
  return ranks;
}

bool IntegrationTest::Done(int generation, int rank) const {
  return std::filesystem::exists(
      absl::StrCat(cluster_->out_dir(), "/gen", generation, "-rank", rank, ".done"));
}

bool IntegrationTest::WaitForStarted(int generation, int count, absl::Duration timeout) const {
  return WaitFor([&] { return static_cast<int>(Started(generation).size()) >= count; }, timeout);
}

bool IntegrationTest::WaitForGone(const std::vector<pid_t>& pids, absl::Duration timeout) const {
  return WaitFor(
      [&] {
        for (pid_t pid : pids) {
          if (ProcessAlive(pid)) return false;
        }
        return true;
      },
      timeout);
}

nlohmann::json IntegrationTest::LoomctlJson(const std::vector<std::string>& args) {
  std::vector<std::string> full = args;
  full.push_back("-o");
  full.push_back("json");
  const CommandResult r = cluster_->Loomctl(full);
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.Describe();
  return j;
}

}  // namespace loom::testing
