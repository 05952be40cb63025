// GPU inventory: the node's GPUs as loomd sees them (Device messages), discovered through the
// CUDA driver API (libcuda.so.1) and NVML (libnvidia-ml.so.1), both loaded at run time with
// dlopen so that one binary runs on machines with and without a driver. No driver, or a driver
// that reports an error, means zero GPUs and one INFO line — never a crash.
//
// The work is split so the aggregation is testable without a GPU: CudaApi and NvmlApi are narrow
// interfaces over the few entry points used; the dlopen-backed implementations are created by
// LoadCudaApi()/LoadNvmlApi(); QueryGpus() combines them and tests feed it fakes.
//
// Devices are indexed by CUDA ordinal (what LOOM_DEVICE=cuda:N means to a rank, including under
// CUDA_VISIBLE_DEVICES); NVML, which numbers GPUs its own way, is joined by PCI bus id.
//
// Threading: QueryGpus() is called once at start-up; the API objects are not shared.
#pragma once

#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "loom/v1/node.pb.h"

namespace loom::worker {

// The CUDA driver entry points the inventory needs. Each returns an error status when the
// driver call fails.
class CudaApi {
 public:
  virtual ~CudaApi() = default;
  virtual absl::Status Init() = 0;
  virtual absl::StatusOr<int> DeviceCount() = 0;
  virtual absl::StatusOr<std::string> Name(int ordinal) = 0;
  virtual absl::StatusOr<uint64_t> TotalMemory(int ordinal) = 0;
  // (major, minor)
  virtual absl::StatusOr<std::pair<int, int>> ComputeCapability(int ordinal) = 0;
  // e.g. "0000:3B:00.0"
  virtual absl::StatusOr<std::string> PciBusId(int ordinal) = 0;
};

// The NVML entry points for NVLink topology.
class NvmlApi {
 public:
  virtual ~NvmlApi() = default;
  virtual absl::Status Init() = 0;
  // PCI bus ids of the devices at the far end of each active NVLink of the GPU at `pci_bus_id`
  // (may repeat when several links join the same pair; may name NVSwitches, not only GPUs).
  virtual absl::StatusOr<std::vector<std::string>> NvLinkPeerBusIds(
      const std::string& pci_bus_id) = 0;
};

// dlopen-backed implementations; NOT_FOUND (with dlerror's text) when the library or a required
// symbol is missing.
absl::StatusOr<std::unique_ptr<CudaApi>> LoadCudaApi();
absl::StatusOr<std::unique_ptr<NvmlApi>> LoadNvmlApi();

// "0000:3b:00.0" for "00000000:3B:00.0", "0000:3B:00.0" or "3b:00.0": lower-case, 4-digit domain.
// Empty when `bus_id` does not parse.
std::string NormalizePciBusId(absl::string_view bus_id);

// The GPUs seen through `cuda` (required) and `nvml` (optional: no NVLink peers without it).
// Per-device errors drop that field, not the device; an Init/DeviceCount error returns it.
absl::StatusOr<std::vector<loom::v1::Device>> QueryGpus(CudaApi& cuda, NvmlApi* nvml);

// Loads the driver libraries and queries them. Never fails: no driver -> empty list and one INFO
// log line saying why.
std::vector<loom::v1::Device> DiscoverGpus();

}  // namespace loom::worker
