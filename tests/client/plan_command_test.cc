// `loomctl plan` offline (--cluster, no server): the table from examples/cluster-h100.yaml, and
// the exit codes of bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "client/commands.h"

namespace loom::client {
namespace {

using ::testing::HasSubstr;

class PlanCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_.connection = nullptr;  // offline: nothing may reach for a server
    ctx_.out = &out_;
    ctx_.err = &err_;
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("plan_command_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  std::ostringstream out_, err_;
  CommandContext ctx_;
  std::filesystem::path dir_;
};

// The value of column `header` in the first data row of a table printed by FormatPlanTable.
std::string FirstRowColumn(const std::string& table, const std::string& header) {
  std::vector<std::string> lines = absl::StrSplit(table, '\n');
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    if (lines[i].rfind("RANK", 0) != 0) continue;
    std::vector<std::string> names = absl::StrSplit(lines[i], ' ', absl::SkipEmpty());
    std::vector<std::string> values = absl::StrSplit(lines[i + 1], ' ', absl::SkipEmpty());
    for (size_t c = 0; c < names.size() && c < values.size(); ++c) {
      if (names[c] == header) return values[c];
    }
  }
  return "";
}

TEST_F(PlanCommandTest, OfflineWithTheExampleClusterPrintsARankedTable) {
  const std::string spec = Write("job.yaml",
                                 "model: {preset: gpt-13b}\n"
                                 "resources: {gpus: 64}\n"
                                 "train: {steps: 10, global_batch_tokens: 2097152}\n"
                                 "parallelism: {auto: {}}\n");
  const std::string cluster = std::string(LOOM_EXAMPLES_DIR) + "/cluster-h100.yaml";
  ASSERT_EQ(RunPlan(ctx_, {.file = spec, .cluster = cluster}), 0) << err_.str();
  const std::string table = out_.str();
  EXPECT_THAT(table, HasSubstr("64 × H100-SXM (80.0 GiB), 8 per node"));
  EXPECT_THAT(table, HasSubstr("MICRO-BATCH"));
  EXPECT_THAT(table, HasSubstr("\n1 "));  // rank 1 starts the first row
  int tp = 0;
  ASSERT_TRUE(absl::SimpleAtoi(FirstRowColumn(table, "TP"), &tp)) << table;
  EXPECT_EQ(40 % tp, 0) << "tp " << tp << " must divide gpt-13b's 40 heads\n" << table;
  EXPECT_LE(tp, 8) << "tensor groups stay inside a node";
  EXPECT_TRUE(err_.str().empty()) << err_.str();
}

TEST_F(PlanCommandTest, JsonOutputIsThePlanJobResponse) {
  const std::string spec = Write("job.yaml", "model: {preset: gpt2-124m}\nresources: {gpus: 8}\n");
  const std::string cluster = std::string(LOOM_EXAMPLES_DIR) + "/cluster-h100.yaml";
  ctx_.format = OutputFormat::kJson;
  ASSERT_EQ(RunPlan(ctx_, {.file = spec, .cluster = cluster, .top_k = 2}), 0) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("\"plans\""));
  EXPECT_THAT(out_.str(), HasSubstr("\"stepSeconds\""));
}

TEST_F(PlanCommandTest, ABadClusterFileIsExit2NamingLineAndColumn) {
  const std::string spec = Write("job.yaml", "model: {preset: gpt2-124m}\nresources: {gpus: 8}\n");
  const std::string cluster = Write("cluster.yaml",
                                    "nodes: 2\n"
                                    "gpus_per_node: eight\n"
                                    "gpu: {model: H100-SXM}\n");
  EXPECT_EQ(RunPlan(ctx_, {.file = spec, .cluster = cluster}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("cluster.yaml:2:"));
  EXPECT_THAT(err_.str(), HasSubstr("gpus_per_node"));
  EXPECT_TRUE(out_.str().empty());
}

TEST_F(PlanCommandTest, ImpossibleSpecsAndMissingFilesAreExit2) {
  const std::string cluster = std::string(LOOM_EXAMPLES_DIR) + "/cluster-h100.yaml";
  const std::string huge = Write("huge.yaml", "model: {preset: gpt-1t}\nresources: {gpus: 8}\n");
  EXPECT_EQ(RunPlan(ctx_, {.file = huge, .cluster = cluster}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("needs at least"));
  err_.str("");
  EXPECT_EQ(RunPlan(ctx_, {.file = huge, .cluster = (dir_ / "nope.yaml").string()}), 2);
  EXPECT_FALSE(err_.str().empty());
}

}  // namespace
}  // namespace loom::client
