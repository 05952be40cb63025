// Which environment variables a job spec may set on its ranks (spec.env), checked by loomd at
// CreateJob and again by loom-worker before launching (defence in depth: a worker never trusts
// that every coordinator it talks to checked the same rules).
//
// A rank runs the operator's program on the operator's node; spec.env may tune it but must not
// change what code runs, where it reads code or configuration from, which devices it uses, or
// make it write files outside its job. So these names are refused (the deny-list):
//   LOOM_*                          the rank contract's own variables (set by loom-worker)
//   LD_*, *_PRELOAD                 the dynamic loader (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...)
//   PATH, PYTHON*, PERL5*, PERLLIB, RUBY*, NODE_OPTIONS, NODE_PATH, JAVA_TOOL_OPTIONS,
//   _JAVA_OPTIONS, CLASSPATH, LUA_PATH, LUA_CPATH, BASH_ENV, ENV, SHELLOPTS, BASHOPTS, IFS, PS4
//                                   program search paths and interpreter start-up hooks
//   GCONV_PATH, LOCPATH, NLSPATH, HOSTALIASES, RESOLV_HOST_CONF, TZDIR, MALLOC_*, GLIBC_TUNABLES
//                                   glibc modules, data files and tunables (gconv modules are
//                                   loaded code; GLIBC_TUNABLES had a loader overflow)
//   OPENSSL_CONF, OPENSSL_ENGINES, OPENSSL_MODULES, SSLKEYLOGFILE
//                                   loadable engines and key logging
//   CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES, CUDA_INJECTION64_PATH, NCCL_*_PLUGIN, NCCL_NET,
//   NCCL_*_FILE                     devices the worker assigns, CUDA/NCCL plugin libraries, and
//                                   NCCL's file inputs and dumps (NCCL_CONF_FILE can set the
//                                   plugin; NCCL_DEBUG_FILE writes anywhere)
// Other NCCL_*, CUDA_*, OMP_*, GLOO_* tuning stays allowed: users legitimately need it.
//
// Limits (loomd's are the worker's, so nothing loomd accepts is refused later): names match
// [A-Z_][A-Z0-9_]* and are at most kMaxEnvNameBytes; values have no NUL byte and at most
// kMaxEnvValueBytes; at most kMaxEnvEntries entries and kMaxEnvTotalBytes in all.
//
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/map.h"

namespace loom {

inline constexpr int kMaxEnvEntries = 64;
inline constexpr size_t kMaxEnvNameBytes = 128;
inline constexpr size_t kMaxEnvValueBytes = 4096;
// Sum over entries of name + value + 2 ("=" and the NUL of envp).
inline constexpr size_t kMaxEnvTotalBytes = 64 * 1024;

// Why `name` may not be set by a spec (one phrase), or nullopt when it may. Does not check the
// name's syntax (see CheckSpecEnv).
std::optional<std::string> DeniedEnvReason(absl::string_view name);

// Checks a spec's env map against every rule above. `field` is the map's path in errors, e.g.
// "spec.env" gives `spec.env["LD_PRELOAD"]: ...`; the first error in name order is returned
// (INVALID_ARGUMENT), and echoed names are truncated.
absl::Status CheckSpecEnv(const google::protobuf::Map<std::string, std::string>& env,
                          absl::string_view field);

}  // namespace loom
