// loom_proto's descriptors are added to protobuf's generated pool on first use, not at program
// start (proto/lazy_descriptors.cmake), and RegisterProtoDescriptors() adds them all for the
// daemons that serve gRPC reflection (proto/register_descriptors.h).
#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <string>

#include "loom/v1/job.pb.h"
#include "proto/register_descriptors.h"

namespace loom {
namespace {

using google::protobuf::DescriptorPool;

// Runs first (and alone, under ctest): nothing has used a Loom message yet, so no Loom file is
// in the pool, which is the start-up parsing this saves.
TEST(ProtoDescriptorsTest, AProgramStartsWithNoLoomFileInThePool) {
  ASSERT_EQ(ProtoFiles().size(), 6u);
  for (const std::string& file : ProtoFiles()) {
    EXPECT_EQ(DescriptorPool::generated_pool()->FindFileByName(file), nullptr) << file;
  }
}

// The first use of a message adds its file and the files it imports; reflection and JSON work
// as with eager registration.
TEST(ProtoDescriptorsTest, UsingAMessageAddsItsFileAndItsImports) {
  v1::Job job;
  job.set_name("jobs/j1");
  job.mutable_spec()->mutable_resources()->set_cpu_devices(2);
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(job, &json).ok());
  EXPECT_NE(json.find("\"cpuDevices\":2"), std::string::npos) << json;
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  EXPECT_NE(pool->FindFileByName("loom/v1/job.proto"), nullptr);
  EXPECT_NE(pool->FindFileByName("loom/v1/job_spec.proto"), nullptr);
  EXPECT_EQ(pool->FindMessageTypeByName("loom.v1.Job"), v1::Job::descriptor());
}

// What gRPC server reflection asks the pool for: every service and message by name.
TEST(ProtoDescriptorsTest, RegisterProtoDescriptorsAddsEveryFile) {
  RegisterProtoDescriptors();
  RegisterProtoDescriptors();  // idempotent
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  for (const std::string& file : ProtoFiles()) {
    EXPECT_NE(pool->FindFileByName(file), nullptr) << file;
  }
  EXPECT_NE(pool->FindServiceByName("loom.v1.JobService"), nullptr);
  EXPECT_NE(pool->FindMessageTypeByName("loom.v1.TraceEvent"), nullptr);
  EXPECT_NE(pool->FindMessageTypeByName("loom.v1.RendezvousScope"), nullptr);
  EXPECT_NE(pool->FindMessageTypeByName("loom.v1.ScaleRankPhases"), nullptr);
  EXPECT_NE(pool->FindMessageTypeByName("loom.v1.Device"), nullptr);
}

}  // namespace
}  // namespace loom
