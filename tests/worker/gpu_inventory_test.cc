// GPU inventory: the aggregation over fake CUDA/NVML symbol tables, bus id normalisation, and
// the no-driver path on a machine without a GPU driver.
#include "worker/agent/gpu_inventory.h"

#include <dlfcn.h>

#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

struct FakeGpu {
  std::string name;
  uint64_t memory;
  int major, minor;
  std::string bus_id;  // as CUDA formats it
};

class FakeCuda : public CudaApi {
 public:
  std::vector<FakeGpu> gpus;
  absl::Status init_status = absl::OkStatus();
  int broken_name = -1;  // ordinal whose Name() fails
  absl::Status Init() override { return init_status; }
  absl::StatusOr<int> DeviceCount() override { return static_cast<int>(gpus.size()); }
  absl::StatusOr<std::string> Name(int i) override {
    if (i == broken_name) return absl::UnavailableError("boom");
    return gpus.at(i).name;
  }
  absl::StatusOr<uint64_t> TotalMemory(int i) override { return gpus.at(i).memory; }
  absl::StatusOr<std::pair<int, int>> ComputeCapability(int i) override {
    return std::make_pair(gpus.at(i).major, gpus.at(i).minor);
  }
  absl::StatusOr<std::string> PciBusId(int i) override { return gpus.at(i).bus_id; }
};

class FakeNvml : public NvmlApi {
 public:
  std::map<std::string, std::vector<std::string>> links;  // NVML bus id format
  absl::Status Init() override { return absl::OkStatus(); }
  absl::StatusOr<std::vector<std::string>> NvLinkPeerBusIds(const std::string& bus) override {
    auto it = links.find(bus);
    if (it == links.end()) return absl::NotFoundError(bus);
    return it->second;
  }
};

TEST(GpuInventoryTest, NormalizesBusIds) {
  EXPECT_EQ(NormalizePciBusId("00000000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(NormalizePciBusId("0000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(NormalizePciBusId("3b:00.1"), "0000:3b:00.1");
  EXPECT_EQ(NormalizePciBusId("garbage"), "");
  EXPECT_EQ(NormalizePciBusId("0000:3b:00.0x"), "");
  EXPECT_EQ(NormalizePciBusId("0000:3b:40.0"), "");  // device > 0x1f
}

TEST(GpuInventoryTest, AggregatesDevicesAndNvLinkPeers) {
  FakeCuda cuda;
  cuda.gpus = {{"NVIDIA H200", 150ull << 30, 9, 0, "0000:1A:00.0"},
               {"NVIDIA H200", 150ull << 30, 9, 0, "0000:2B:00.0"},
               {"NVIDIA H200", 150ull << 30, 9, 0, "0000:3C:00.0"}};
  FakeNvml nvml;
  // Two links between GPU 0 and 1, one to an NVSwitch (unknown bus), none for GPU 2.
  nvml.links["0000:1a:00.0"] = {"00000000:2B:00.0", "00000000:2B:00.0", "00000000:99:00.0"};
  nvml.links["0000:2b:00.0"] = {"00000000:1A:00.0"};
  nvml.links["0000:3c:00.0"] = {};
  auto devices = QueryGpus(cuda, &nvml);
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 3u);
  const v1::Device& d0 = (*devices)[0];
  EXPECT_EQ(d0.kind(), v1::DEVICE_KIND_GPU);
  EXPECT_EQ(d0.index(), 0);
  EXPECT_EQ(d0.model(), "NVIDIA H200");
  EXPECT_EQ(d0.memory_bytes(), 150ull << 30);
  EXPECT_EQ(d0.compute_capability(), "9.0");
  EXPECT_EQ(d0.pci_bus_id(), "0000:1a:00.0");
  EXPECT_THAT(d0.nvlink_peers(), ElementsAre(1));
  EXPECT_THAT((*devices)[1].nvlink_peers(), ElementsAre(0));
  EXPECT_THAT((*devices)[2].nvlink_peers(), IsEmpty());
}

TEST(GpuInventoryTest, WorksWithoutNvmlAndSurvivesPerDeviceErrors) {
  FakeCuda cuda;
  cuda.gpus = {{"A", 1, 8, 0, "0000:01:00.0"}, {"B", 2, 8, 6, "bad bus"}};
  cuda.broken_name = 0;
  auto devices = QueryGpus(cuda, nullptr);
  ASSERT_TRUE(devices.ok());
  ASSERT_EQ(devices->size(), 2u);
  EXPECT_EQ((*devices)[0].model(), "");  // the failed field is left out, not the device
  EXPECT_EQ((*devices)[1].compute_capability(), "8.6");
  EXPECT_EQ((*devices)[1].pci_bus_id(), "");
}

TEST(GpuInventoryTest, DriverErrorsAreStatuses) {
  FakeCuda cuda;
  cuda.init_status = absl::UnavailableError("cuInit failed with CUresult 100");
  EXPECT_FALSE(QueryGpus(cuda, nullptr).ok());
}

TEST(GpuInventoryTest, NoDriverMeansNoGpus) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib != nullptr) {
    dlclose(lib);
    GTEST_SKIP() << "a CUDA driver is installed here; the no-driver path cannot be observed";
  }
  EXPECT_FALSE(LoadCudaApi().ok());
  EXPECT_THAT(DiscoverGpus(), IsEmpty());
}

}  // namespace
}  // namespace loom::worker
