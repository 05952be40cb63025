// NodeRegistry: registration checks, sessions, allocation and the scheduler's snapshot.
#include "server/nodes/node_registry.h"

#include <map>
#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/loomd_test_util.h"

namespace loom::nodes {
namespace {

using ::loom::testing::CpuNode;
using ::loom::testing::FakeSink;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(NodeRegistryTest, RegistrationIsValidated) {
  EXPECT_TRUE(ValidateRegistration(CpuNode("gpu-node-1", 2)).ok());
  EXPECT_THAT(Message(ValidateRegistration(CpuNode("", 2))), HasSubstr("node_id"));
  EXPECT_THAT(Message(ValidateRegistration(CpuNode("UPPER", 2))), HasSubstr("[a-z0-9-]"));
  EXPECT_THAT(Message(ValidateRegistration(CpuNode(std::string(64, 'a'), 2))),
              HasSubstr("node_id"));
  EXPECT_THAT(Message(ValidateRegistration(CpuNode("n1", 0))), HasSubstr("devices"));
  v1::RegisterNodeRequest duplicate = CpuNode("n1", 2);
  duplicate.mutable_devices(1)->set_index(0);
  EXPECT_THAT(Message(ValidateRegistration(duplicate)), HasSubstr("devices[1].index"));
  v1::RegisterNodeRequest no_kind = CpuNode("n1", 1);
  no_kind.mutable_devices(0)->set_kind(v1::DEVICE_KIND_UNSPECIFIED);
  EXPECT_THAT(Message(ValidateRegistration(no_kind)), HasSubstr("devices[0].kind"));
  v1::RegisterNodeRequest cores = CpuNode("n1", 8);
  for (int ok : {0, 2, kMaxCpuCores}) {
    cores.set_cpu_cores(ok);
    EXPECT_TRUE(ValidateRegistration(cores).ok()) << ok;
  }
  for (int bad : {-1, kMaxCpuCores + 1}) {
    cores.set_cpu_cores(bad);
    EXPECT_THAT(Message(ValidateRegistration(cores)), HasSubstr("cpu_cores")) << bad;
  }
}

TEST(NodeRegistryTest, TheNodeKeepsTheCoresItsWorkerReported) {
  NodeRegistry registry;
  const absl::Time now = absl::FromUnixSeconds(1000);
  v1::RegisterNodeRequest request = CpuNode("a", 8);
  request.set_cpu_cores(2);
  EXPECT_EQ(registry.Registered(request, now).cpu_cores(), 2);
  EXPECT_EQ(registry.Registered(CpuNode("b", 8), now).cpu_cores(), 0);  // an older worker
}

TEST(NodeRegistryTest, OnlyReadyNodesWithASessionAreSchedulable) {
  NodeRegistry registry;
  const absl::Time now = absl::FromUnixSeconds(1000);
  registry.Put(registry.Registered(CpuNode("a", 4), now), now);
  registry.Put(registry.Registered(CpuNode("b", 2), now), now);
  EXPECT_TRUE(registry.Snapshot().empty());
  auto sink = std::make_shared<FakeSink>();
  const uint64_t id = registry.OpenSession("nodes/a", sink);
  ASSERT_NE(id, 0u);
  registry.Allocate("nodes/a", {1, 2}, "jobs/x");
  std::vector<scheduler::NodeSnapshot> snapshot = registry.Snapshot();
  ASSERT_EQ(snapshot.size(), 1u);
  EXPECT_EQ(snapshot[0].name, "nodes/a");
  EXPECT_EQ(snapshot[0].total_devices, 4);
  EXPECT_THAT(snapshot[0].free_devices, ElementsAre(0, 3));
  registry.Release("jobs/x");
  EXPECT_THAT(registry.Snapshot()[0].free_devices, ElementsAre(0, 1, 2, 3));

  Capacity capacity = registry.ReadyCapacity();
  EXPECT_EQ(capacity.cpu_devices, 6);
  EXPECT_EQ(capacity.max_cpu_devices_per_node, 4);
  EXPECT_EQ(capacity.ready_nodes, 2);

  // A second session replaces (and closes) the first; the old id is no longer current.
  auto sink2 = std::make_shared<FakeSink>();
  const uint64_t id2 = registry.OpenSession("nodes/a", sink2);
  EXPECT_TRUE(sink->closed());
  EXPECT_FALSE(registry.IsCurrentSession("nodes/a", id));
  EXPECT_TRUE(registry.IsCurrentSession("nodes/a", id2));
  registry.CloseSession("nodes/a", id);  // stale close: ignored
  EXPECT_TRUE(registry.IsCurrentSession("nodes/a", id2));
  registry.CloseSession("nodes/a", id2);
  EXPECT_TRUE(sink2->closed());
  EXPECT_TRUE(registry.Snapshot().empty());
}

// A node `id` with one CPU device and `gpus` GPUs.
v1::RegisterNodeRequest GpuNode(const std::string& id, int gpus) {
  v1::RegisterNodeRequest request = CpuNode(id, 1);
  for (int i = 0; i < gpus; ++i) {
    v1::Device* d = request.add_devices();
    d->set_kind(v1::DEVICE_KIND_GPU);
    d->set_index(i);
  }
  return request;
}

TEST(NodeRegistryTest, GpuNodesOfferTheirGpus) {
  NodeRegistry registry;
  const absl::Time now = absl::FromUnixSeconds(1000);
  registry.Put(registry.Registered(GpuNode("g", 2), now), now);
  registry.OpenSession("nodes/g", std::make_shared<FakeSink>());
  std::vector<scheduler::NodeSnapshot> snapshot = registry.Snapshot();
  ASSERT_EQ(snapshot.size(), 1u);
  EXPECT_EQ(snapshot[0].kind, v1::DEVICE_KIND_GPU);
  EXPECT_EQ(snapshot[0].total_devices, 2);
  EXPECT_EQ(registry.ReadyCapacity().gpus, 2);
  EXPECT_EQ(registry.ReadyCapacity().cpu_devices, 0);
}

// FreeDevices counts what a snapshot would hold, per kind, without building one: only nodes
// with a session, only the node's own kind (a GPU node's CPU devices are not offered), minus
// what is allocated.
TEST(NodeRegistryTest, FreeDevicesCountsWhatTheSnapshotHolds) {
  NodeRegistry registry;
  const absl::Time now = absl::FromUnixSeconds(1000);
  registry.Put(registry.Registered(CpuNode("a", 4), now), now);
  registry.Put(registry.Registered(CpuNode("b", 2), now), now);  // no session
  registry.Put(registry.Registered(GpuNode("g", 2), now), now);
  registry.OpenSession("nodes/a", std::make_shared<FakeSink>());
  registry.OpenSession("nodes/g", std::make_shared<FakeSink>());
  registry.Allocate("nodes/a", {1, 2}, "jobs/x");
  registry.Allocate("nodes/g", {0}, "jobs/y");

  std::map<v1::DeviceKind, int> from_snapshot;
  for (const scheduler::NodeSnapshot& node : registry.Snapshot()) {
    from_snapshot[node.kind] += static_cast<int>(node.free_devices.size());
  }
  for (const v1::DeviceKind kind : {v1::DEVICE_KIND_CPU, v1::DEVICE_KIND_GPU}) {
    EXPECT_EQ(registry.FreeDevices(kind), from_snapshot[kind]) << v1::DeviceKind_Name(kind);
  }
  EXPECT_EQ(registry.FreeDevices(v1::DEVICE_KIND_CPU), 2);
  EXPECT_EQ(registry.FreeDevices(v1::DEVICE_KIND_GPU), 1);
  registry.Release("jobs/x");
  EXPECT_EQ(registry.FreeDevices(v1::DEVICE_KIND_CPU), 4);
}

}  // namespace
}  // namespace loom::nodes
