#include "common/env_policy.h"

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/echo.h"

namespace loom {
namespace {

struct Rule {
  absl::string_view pattern;  // exact name, "PREFIX*" or "*SUFFIX"
  absl::string_view reason;
};

constexpr char kLoader[] = "it changes what the dynamic loader loads into every rank";
constexpr char kSearch[] = "it changes where programs and interpreters load code from";
constexpr char kGlibc[] =
    "it makes glibc load modules, data files or tunables of the spec's choice";
constexpr char kTls[] = "it makes OpenSSL load code or write key material";
constexpr char kDevices[] = "loom-worker assigns each rank's devices";
constexpr char kPlugin[] = "it makes CUDA or NCCL load a plugin library or read/write a file";

constexpr Rule kDenied[] = {
    {"LOOM_*", "LOOM_* variables are set by loom-worker (the rank contract)"},
    {"LD_*", kLoader},
    {"*_PRELOAD", kLoader},
    {"PATH", kSearch},
    {"PYTHON*", kSearch},
    {"PERL5*", kSearch},
    {"PERLLIB", kSearch},
    {"RUBY*", kSearch},
    {"NODE_OPTIONS", kSearch},
    {"NODE_PATH", kSearch},
    {"JAVA_TOOL_OPTIONS", kSearch},
    {"_JAVA_OPTIONS", kSearch},
    {"CLASSPATH", kSearch},
    {"LUA_PATH", kSearch},
    {"LUA_CPATH", kSearch},
    {"BASH_ENV", kSearch},
    {"ENV", kSearch},
    {"SHELLOPTS", kSearch},
    {"BASHOPTS", kSearch},
    {"IFS", kSearch},
    {"PS4", kSearch},
    {"GCONV_PATH", kGlibc},
    {"LOCPATH", kGlibc},
    {"NLSPATH", kGlibc},
    {"HOSTALIASES", kGlibc},
    {"RESOLV_HOST_CONF", kGlibc},
    {"TZDIR", kGlibc},
    {"MALLOC_*", kGlibc},
    {"GLIBC_TUNABLES", kGlibc},
    {"OPENSSL_CONF", kTls},
    {"OPENSSL_ENGINES", kTls},
    {"OPENSSL_MODULES", kTls},
    {"SSLKEYLOGFILE", kTls},
    {"CUDA_VISIBLE_DEVICES", kDevices},
    {"NVIDIA_VISIBLE_DEVICES", kDevices},
    {"CUDA_INJECTION64_PATH", kPlugin},
    {"NCCL_NET", kPlugin},
    {"NCCL_*_PLUGIN", kPlugin},
    {"NCCL_*_FILE", kPlugin},
};

bool Matches(absl::string_view pattern, absl::string_view name) {
  const size_t star = pattern.find('*');
  if (star == absl::string_view::npos) return pattern == name;
  const absl::string_view head = pattern.substr(0, star);
  const absl::string_view tail = pattern.substr(star + 1);
  return name.size() >= head.size() + tail.size() && absl::StartsWith(name, head) &&
         absl::EndsWith(name, tail);
}

bool IsValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxEnvNameBytes) return false;
  if (!((name[0] >= 'A' && name[0] <= 'Z') || name[0] == '_')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

absl::Status Invalid(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

}  // namespace

std::optional<std::string> DeniedEnvReason(absl::string_view name) {
  for (const Rule& rule : kDenied) {
    if (Matches(rule.pattern, name)) return std::string(rule.reason);
  }
  return std::nullopt;
}

absl::Status CheckSpecEnv(const google::protobuf::Map<std::string, std::string>& env,
                          absl::string_view field) {
  if (env.size() > static_cast<size_t>(kMaxEnvEntries)) {
    return Invalid(field,
                   absl::StrCat(env.size(), " entries; at most ", kMaxEnvEntries, " are allowed"));
  }
  // Sorted, so that the error for a spec with several bad names does not depend on map order.
  std::vector<absl::string_view> names;
  size_t total = 0;
  for (const auto& [name, value] : env) {
    names.push_back(name);
    total += name.size() + value.size() + 2;
  }
  std::sort(names.begin(), names.end());
  for (const absl::string_view name : names) {
    const std::string entry = absl::StrCat(field, "[", Echo(name), "]");
    if (!IsValidName(name)) {
      return Invalid(entry, absl::StrCat("a variable name must match [A-Z_][A-Z0-9_]* and have at "
                                         "most ",
                                         kMaxEnvNameBytes, " characters, e.g. MY_SETTING"));
    }
    if (const std::optional<std::string> why = DeniedEnvReason(name); why.has_value()) {
      return Invalid(entry, absl::StrCat("may not be set by a job spec: ", *why,
                                         "; remove it (an operator who needs it sets it in "
                                         "loom-worker's own environment)"));
    }
    const std::string& value = env.at(std::string(name));
    if (value.find('\0') != std::string::npos) {
      return Invalid(entry, "the value contains a NUL byte, which an environment cannot hold");
    }
    if (value.size() > kMaxEnvValueBytes) {
      return Invalid(entry, absl::StrCat("the value has ", value.size(), " bytes; at most ",
                                         kMaxEnvValueBytes, " are allowed"));
    }
  }
  if (total > kMaxEnvTotalBytes) {
    return Invalid(field, absl::StrCat("names and values add up to ", total, " bytes; at most ",
                                       kMaxEnvTotalBytes, " are allowed"));
  }
  return absl::OkStatus();
}

}  // namespace loom
