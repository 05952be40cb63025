// -o json|yaml renderings through the protobuf JSON mapping (client/output_format.h).
#include "client/output_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "common/yaml_json.h"
#include "loom/v1/job.pb.h"

namespace loom::client {
namespace {

using ::testing::HasSubstr;

loom::v1::Job SomeJob() {
  loom::v1::Job job;
  job.set_name("jobs/abc");
  job.set_state(loom::v1::SUCCEEDED);
  job.mutable_progress()->set_step(20);
  job.mutable_progress()->set_total_steps(20);
  job.mutable_progress()->set_loss(1.25);
  (*job.mutable_spec()->mutable_env())["LOOM_TEST_STEPS"] = "20";
  return job;
}

TEST(OutputFormatTest, ParsesNames) {
  EXPECT_EQ(*ParseOutputFormat("table"), OutputFormat::kTable);
  EXPECT_EQ(*ParseOutputFormat("json"), OutputFormat::kJson);
  EXPECT_EQ(*ParseOutputFormat("yaml"), OutputFormat::kYaml);
  auto bad = ParseOutputFormat("xml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("use table, json or yaml"));
}

TEST(OutputFormatTest, JsonIsTheProtobufMappingWithEveryField) {
  const std::string text = RenderMessage(SomeJob(), OutputFormat::kJson);
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["name"], "jobs/abc");
  EXPECT_EQ(j["state"], "SUCCEEDED");
  EXPECT_EQ(j["progress"]["step"], "20");  // int64 as a string, per the mapping
  EXPECT_EQ(j["progress"]["totalSteps"], "20");
  EXPECT_EQ(j["restartCount"], 0);  // default values are printed too
  EXPECT_EQ(j["spec"]["env"]["LOOM_TEST_STEPS"], "20");
  // Field order, not alphabetical.
  EXPECT_LT(text.find("\"name\""), text.find("\"spec\""));
  EXPECT_LT(text.find("\"spec\""), text.find("\"state\""));
}

TEST(OutputFormatTest, CompactJsonIsOneLine) {
  const std::string text = RenderMessage(SomeJob(), OutputFormat::kJson, /*compact=*/true);
  EXPECT_EQ(text.find('\n'), text.size() - 1);
}

TEST(OutputFormatTest, YamlCarriesTheSameValues) {
  const std::string text = RenderMessage(SomeJob(), OutputFormat::kYaml);
  EXPECT_THAT(text, HasSubstr("name: jobs/abc\n"));
  EXPECT_THAT(text, HasSubstr("state: SUCCEEDED\n"));
  auto node = ParseYamlDocument(text, "out.yaml");
  ASSERT_TRUE(node.ok()) << node.status();
  const nlohmann::json j = YamlToJson(*node);
  EXPECT_EQ(j["progress"]["step"], "20");
  EXPECT_DOUBLE_EQ(j["progress"]["loss"].get<double>(), 1.25);
  EXPECT_EQ(j["spec"]["env"]["LOOM_TEST_STEPS"], "20");
}

}  // namespace
}  // namespace loom::client
