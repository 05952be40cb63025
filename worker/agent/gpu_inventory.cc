#include "worker/agent/gpu_inventory.h"

#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace loom::worker {
namespace {

// The few CUDA driver and NVML types and constants used, declared here so the worker builds
// without the CUDA headers (values from cuda.h and nvml.h, stable across driver versions).
using CUresult = int;
using CUdevice = int;
constexpr int kCuAttrComputeCapabilityMajor = 75;
constexpr int kCuAttrComputeCapabilityMinor = 76;
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
constexpr unsigned kNvmlNvLinkMaxLinks = 18;
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pciDeviceId;
  unsigned pciSubSystemId;
  char busId[32];
};
// Driver limits on what a sane machine reports.
constexpr int kMaxGpus = 256;

// Looks up `name` in `lib` into `fn`; false when missing.
template <typename Fn>
bool Bind(void* lib, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  return *fn != nullptr;
}

std::string DlError() {
  const char* e = dlerror();
  return e != nullptr ? e : "unknown dlopen error";
}

class DlCudaApi final : public CudaApi {
 public:
  static absl::StatusOr<std::unique_ptr<CudaApi>> Load() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return absl::NotFoundError(DlError());
    auto api = std::unique_ptr<DlCudaApi>(new DlCudaApi(lib));
    const bool ok = Bind(lib, "cuInit", &api->init_) &&
                    Bind(lib, "cuDeviceGetCount", &api->count_) &&
                    Bind(lib, "cuDeviceGet", &api->get_) &&
                    Bind(lib, "cuDeviceGetName", &api->name_) &&
                    Bind(lib, "cuDeviceTotalMem_v2", &api->total_mem_) &&
                    Bind(lib, "cuDeviceGetAttribute", &api->attr_) &&
                    Bind(lib, "cuDeviceGetPCIBusId", &api->bus_id_);
    if (!ok) return absl::NotFoundError(absl::StrCat("libcuda.so.1: ", DlError()));
    return std::unique_ptr<CudaApi>(std::move(api));
  }
  // The library stays loaded: unloading a GPU driver mid-process is never worth the risk.

  absl::Status Init() override { return Check(init_(0), "cuInit"); }
  absl::StatusOr<int> DeviceCount() override {
    int n = 0;
    if (absl::Status st = Check(count_(&n), "cuDeviceGetCount"); !st.ok()) return st;
    return n;
  }
  absl::StatusOr<std::string> Name(int ordinal) override {
    CUdevice dev;
    if (absl::Status st = Check(get_(&dev, ordinal), "cuDeviceGet"); !st.ok()) return st;
    char buf[256] = {};
    if (absl::Status st = Check(name_(buf, sizeof(buf) - 1, dev), "cuDeviceGetName"); !st.ok()) {
      return st;
    }
    return std::string(buf);
  }
  absl::StatusOr<uint64_t> TotalMemory(int ordinal) override {
    CUdevice dev;
    if (absl::Status st = Check(get_(&dev, ordinal), "cuDeviceGet"); !st.ok()) return st;
    size_t bytes = 0;
    if (absl::Status st = Check(total_mem_(&bytes, dev), "cuDeviceTotalMem"); !st.ok()) return st;
    return static_cast<uint64_t>(bytes);
  }
  absl::StatusOr<std::pair<int, int>> ComputeCapability(int ordinal) override {
    CUdevice dev;
    if (absl::Status st = Check(get_(&dev, ordinal), "cuDeviceGet"); !st.ok()) return st;
    int major = 0, minor = 0;
    absl::Status st =
        Check(attr_(&major, kCuAttrComputeCapabilityMajor, dev), "cuDeviceGetAttribute");
    if (st.ok()) {
      st = Check(attr_(&minor, kCuAttrComputeCapabilityMinor, dev), "cuDeviceGetAttribute");
    }
    if (!st.ok()) return st;
    return std::make_pair(major, minor);
  }
  absl::StatusOr<std::string> PciBusId(int ordinal) override {
    CUdevice dev;
    if (absl::Status st = Check(get_(&dev, ordinal), "cuDeviceGet"); !st.ok()) return st;
    char buf[64] = {};
    if (absl::Status st = Check(bus_id_(buf, sizeof(buf) - 1, dev), "cuDeviceGetPCIBusId");
        !st.ok()) {
      return st;
    }
    return std::string(buf);
  }

 private:
  explicit DlCudaApi(void* lib) : lib_(lib) {}
  static absl::Status Check(CUresult r, const char* what) {
    if (r == 0) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(what, " failed with CUresult ", r));
  }
  void* lib_;
  CUresult (*init_)(unsigned) = nullptr;
  CUresult (*count_)(int*) = nullptr;
  CUresult (*get_)(CUdevice*, int) = nullptr;
  CUresult (*name_)(char*, int, CUdevice) = nullptr;
  CUresult (*total_mem_)(size_t*, CUdevice) = nullptr;
  CUresult (*attr_)(int*, int, CUdevice) = nullptr;
  CUresult (*bus_id_)(char*, int, CUdevice) = nullptr;
};

class DlNvmlApi final : public NvmlApi {
 public:
  static absl::StatusOr<std::unique_ptr<NvmlApi>> Load() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return absl::NotFoundError(DlError());
    auto api = std::unique_ptr<DlNvmlApi>(new DlNvmlApi());
    const bool ok = Bind(lib, "nvmlInit_v2", &api->init_) &&
                    Bind(lib, "nvmlDeviceGetHandleByPciBusId_v2", &api->by_bus_id_) &&
                    Bind(lib, "nvmlDeviceGetNvLinkState", &api->link_state_) &&
                    Bind(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2", &api->remote_pci_);
    if (!ok) return absl::NotFoundError(absl::StrCat("libnvidia-ml.so.1: ", DlError()));
    return std::unique_ptr<NvmlApi>(std::move(api));
  }

  absl::Status Init() override {
    const nvmlReturn_t r = init_();
    if (r != 0) return absl::UnavailableError(absl::StrCat("nvmlInit failed with ", r));
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<std::string>> NvLinkPeerBusIds(
      const std::string& pci_bus_id) override {
    nvmlDevice_t dev = nullptr;
    if (const nvmlReturn_t r = by_bus_id_(pci_bus_id.c_str(), &dev); r != 0) {
      return absl::NotFoundError(absl::StrCat("nvmlDeviceGetHandleByPciBusId(", pci_bus_id,
                                              ") failed with ", r));
    }
    std::vector<std::string> peers;
    for (unsigned link = 0; link < kNvmlNvLinkMaxLinks; ++link) {
      int active = 0;  // nvmlEnableState_t
      if (link_state_(dev, link, &active) != 0 || active == 0) continue;
      nvmlPciInfo_t info{};
      if (remote_pci_(dev, link, &info) != 0) continue;
      info.busId[sizeof(info.busId) - 1] = '\0';
      peers.emplace_back(info.busId);
    }
    return peers;
  }

 private:
  nvmlReturn_t (*init_)() = nullptr;
  nvmlReturn_t (*by_bus_id_)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*link_state_)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*remote_pci_)(nvmlDevice_t, unsigned, nvmlPciInfo_t*) = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaApi>> LoadCudaApi() { return DlCudaApi::Load(); }
absl::StatusOr<std::unique_ptr<NvmlApi>> LoadNvmlApi() { return DlNvmlApi::Load(); }

std::string NormalizePciBusId(absl::string_view bus_id) {
  // [domain:]bus:device.function, each part 1..8 hex digits.
  std::vector<unsigned> parts;
  std::vector<char> separators;
  unsigned value = 0;
  int digits = 0;
  for (char c : bus_id) {
    const char lower = absl::ascii_tolower(static_cast<unsigned char>(c));
    if (absl::ascii_isxdigit(static_cast<unsigned char>(c))) {
      if (++digits > 8) return "";
      value = value * 16 + static_cast<unsigned>(lower <= '9' ? lower - '0' : lower - 'a' + 10);
    } else if ((c == ':' || c == '.') && digits > 0) {
      parts.push_back(value);
      separators.push_back(c);
      value = 0;
      digits = 0;
    } else {
      return "";
    }
  }
  if (digits == 0) return "";
  parts.push_back(value);
  if (parts.size() == 3) {
    parts.insert(parts.begin(), 0);
    separators.insert(separators.begin(), ':');
  }
  if (parts.size() != 4 || separators != std::vector<char>{':', ':', '.'}) return "";
  if (parts[0] > 0xffff || parts[1] > 0xff || parts[2] > 0x1f || parts[3] > 0x7) return "";
  return absl::StrFormat("%04x:%02x:%02x.%x", parts[0], parts[1], parts[2], parts[3]);
}

absl::StatusOr<std::vector<loom::v1::Device>> QueryGpus(CudaApi& cuda, NvmlApi* nvml) {
  if (absl::Status st = cuda.Init(); !st.ok()) return st;
  absl::StatusOr<int> count = cuda.DeviceCount();
  if (!count.ok()) return count.status();
  if (*count < 0 || *count > kMaxGpus) {
    return absl::OutOfRangeError(absl::StrCat("the driver reports ", *count, " GPUs"));
  }
  std::vector<loom::v1::Device> devices;
  std::map<std::string, int> ordinal_by_bus;  // normalised bus id -> ordinal
  for (int i = 0; i < *count; ++i) {
    loom::v1::Device d;
    d.set_kind(loom::v1::DEVICE_KIND_GPU);
    d.set_index(i);
    if (auto name = cuda.Name(i); name.ok()) d.set_model(*name);
    if (auto mem = cuda.TotalMemory(i); mem.ok()) d.set_memory_bytes(*mem);
    if (auto cc = cuda.ComputeCapability(i); cc.ok()) {
      d.set_compute_capability(absl::StrCat(cc->first, ".", cc->second));
    }
    if (auto bus = cuda.PciBusId(i); bus.ok()) {
      const std::string norm = NormalizePciBusId(*bus);
      if (!norm.empty()) {
        d.set_pci_bus_id(norm);
        ordinal_by_bus.emplace(norm, i);
      }
    }
    devices.push_back(std::move(d));
  }
  if (nvml != nullptr && !devices.empty()) {
    if (absl::Status st = nvml->Init(); !st.ok()) {
      LOOM_LOG(INFO) << "gpu inventory: NVML unavailable (" << st.message()
                     << "); NVLink peers unknown";
      return devices;
    }
    for (loom::v1::Device& d : devices) {
      if (d.pci_bus_id().empty()) continue;
      auto peers = nvml->NvLinkPeerBusIds(d.pci_bus_id());
      if (!peers.ok()) continue;
      std::set<int> indices;
      for (const std::string& peer : *peers) {
        auto it = ordinal_by_bus.find(NormalizePciBusId(peer));
        // Links to NVSwitches or to GPUs hidden by CUDA_VISIBLE_DEVICES have no ordinal here.
        if (it != ordinal_by_bus.end() && it->second != d.index()) indices.insert(it->second);
      }
      for (int peer : indices) d.add_nvlink_peers(peer);
    }
  }
  return devices;
}

std::vector<loom::v1::Device> DiscoverGpus() {
  absl::StatusOr<std::unique_ptr<CudaApi>> cuda = LoadCudaApi();
  if (!cuda.ok()) {
    LOOM_LOG(INFO) << "gpu inventory: no CUDA driver (" << cuda.status().message()
                   << "); 0 GPUs";
    return {};
  }
  absl::StatusOr<std::unique_ptr<NvmlApi>> nvml = LoadNvmlApi();
  absl::StatusOr<std::vector<loom::v1::Device>> gpus =
      QueryGpus(**cuda, nvml.ok() ? nvml->get() : nullptr);
  if (!gpus.ok()) {
    LOOM_LOG(INFO) << "gpu inventory: the CUDA driver reports no usable GPU ("
                   << gpus.status().message() << "); 0 GPUs";
    return {};
  }
  LOOM_LOG(INFO) << "gpu inventory: " << gpus->size() << " GPU(s)"
                 << (gpus->empty() ? "" : absl::StrCat(", ", (*gpus)[0].model()));
  return *std::move(gpus);
}

}  // namespace loom::worker
