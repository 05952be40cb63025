// common/json_message.h: a message set by reflection from checked JSON, and the errors that such
// JSON can still carry, each naming its field path.
#include "common/json_message.h"

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>

#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"

namespace loom {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

TEST(JsonMessageTest, SetsScalarsEnumsRepeatedMapsAndMessagesInEitherSpelling) {
  loom::v1::JobSpec spec;
  const json tree = json::parse(R"({
    "name": "j", "priority": -3,
    "train": {"steps": 9223372036854775807, "lr": "NaN", "weight_decay": "-Infinity"},
    "resources": {"cpuDevices": 4},
    "env": {"A": "1", "B": ""},
    "parallelism": {"auto": {}}
  })");
  ASSERT_TRUE(SetMessageFromCheckedJson(tree, &spec).ok());
  EXPECT_EQ(spec.name(), "j");
  EXPECT_EQ(spec.priority(), -3);
  EXPECT_EQ(spec.train().steps(), 9223372036854775807);
  EXPECT_TRUE(std::isnan(spec.train().lr()));
  ASSERT_TRUE(spec.train().has_weight_decay());  // optional: present although set from JSON
  EXPECT_EQ(spec.train().weight_decay(), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(spec.resources().cpu_devices(), 4);
  ASSERT_EQ(spec.env().size(), 2u);
  EXPECT_EQ(spec.env().at("A"), "1");
  EXPECT_EQ(spec.env().at("B"), "");
  EXPECT_TRUE(spec.parallelism().has_auto_());

  google::protobuf::FieldDescriptorProto field;
  ASSERT_TRUE(SetMessageFromCheckedJson(
                  json::parse(R"({"name": "f", "number": 3, "type": "TYPE_INT64"})"), &field)
                  .ok());
  EXPECT_EQ(field.type(), google::protobuf::FieldDescriptorProto::TYPE_INT64);
  google::protobuf::DescriptorProto message;
  ASSERT_TRUE(
      SetMessageFromCheckedJson(
          json::parse(R"({"field": [{"name": "a"}, {"name": "b"}], "reservedName": ["x"]})"),
          &message)
          .ok());
  ASSERT_EQ(message.field_size(), 2);
  EXPECT_EQ(message.field(1).name(), "b");
  EXPECT_EQ(message.reserved_name(0), "x");
}

TEST(JsonMessageTest, WhatCheckedJsonCanStillGetWrongIsRefusedWithItsPath) {
  struct Case {
    const char* json;
    const char* error;
  };
  for (const Case& c : std::initializer_list<Case>{
           {R"({"number": 3000000000})", "number: expected a 32-bit integer"},
           {R"({"number": 1.5})", "number: expected a 32-bit integer"},
           {R"({"name": 5})", "name: expected a string"},
           {R"({"type": "TYPE_NOPE"})", "type: no value \"TYPE_NOPE\" in"},
           {R"({"type": 3})", "type: no value 3 in"},
           {R"({"proto3Optional": "yes"})", "proto3Optional: expected true or false"},
           {R"({"nope": 1})", "nope: no such field in google.protobuf.FieldDescriptorProto"},
       }) {
    SCOPED_TRACE(c.json);
    google::protobuf::FieldDescriptorProto field;
    const absl::Status s = SetMessageFromCheckedJson(json::parse(c.json), &field);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(c.error));
  }
  google::protobuf::DescriptorProto message;
  EXPECT_THAT(
      SetMessageFromCheckedJson(json::parse(R"({"field": {"name": "a"}})"), &message).message(),
      HasSubstr("field: expected an array"));
  loom::v1::JobSpec spec;
  EXPECT_THAT(
      SetMessageFromCheckedJson(json::parse(R"({"train": {"steps": "x"}})"), &spec).message(),
      HasSubstr("train.steps: expected a 64-bit integer"));
  EXPECT_THAT(SetMessageFromCheckedJson(json::parse(R"({"env": ["A"]})"), &spec).message(),
              HasSubstr("env: expected an object"));
  EXPECT_THAT(SetMessageFromCheckedJson(json::parse(R"({"env": {"A": 1}})"), &spec).message(),
              HasSubstr("env.A: expected a string"));
  // Two members of one oneof (whichever comes second is named): protobuf's JSON parser refuses
  // them too.
  loom::v1::WorkerMessage worker;
  EXPECT_THAT(SetMessageFromCheckedJson(json::parse(R"({"hello": {}, "heartbeat": {}})"), &worker)
                  .message(),
              HasSubstr("another field of the oneof 'msg' is already set"));
  loom::v1::WorkerMessage parsed;
  EXPECT_FALSE(
      google::protobuf::util::JsonStringToMessage(R"({"hello": {}, "heartbeat": {}})", &parsed)
          .ok());
}

}  // namespace
}  // namespace loom
