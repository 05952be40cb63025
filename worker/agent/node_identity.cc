#include "worker/agent/node_identity.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"

namespace loom::worker {

std::string SanitizeNodeId(std::string_view hostname) {
  std::string out;
  for (char c : hostname) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (ok) {
      out.push_back(c);
    } else if (!out.empty() && out.back() != '-') {
      out.push_back('-');
    }
  }
  if (out.size() > 63) out.resize(63);
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "node" : out;
}

bool IsValidNodeId(std::string_view id) {
  if (id.empty() || id.size() > 63 || id.front() == '-' || id.back() == '-') return false;
  for (char c : id) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

std::string Hostname() {
  utsname u{};
  if (::uname(&u) != 0 || u.nodename[0] == '\0') return "localhost";
  return u.nodename;
}

std::vector<loom::v1::Device> CpuDevices(int count) {
  std::vector<loom::v1::Device> devices;
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  const uint64_t total =
      pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * page_size : 0;
  for (int i = 0; i < count; ++i) {
    loom::v1::Device d;
    d.set_kind(loom::v1::DEVICE_KIND_CPU);
    d.set_index(i);
    d.set_model("cpu");
    d.set_memory_bytes(count > 0 ? total / static_cast<uint64_t>(count) : 0);
    devices.push_back(std::move(d));
  }
  return devices;
}

absl::StatusOr<std::string> ExecutableDir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return absl::NotFoundError(absl::StrCat("reading /proc/self/exe: ", ec.message()));
  return exe.parent_path().string();
}

}  // namespace loom::worker
