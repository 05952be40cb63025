// Which user the ranks run as (loom-worker --rank-user). Ranks run code and read data named by
// job specs, so a worker running as root must not hand them root: by default (no flag) a root
// worker runs its ranks as `nobody`; `--rank-user=root` is the explicit opt-out for development.
// A worker not running as root can only run ranks as itself (the flag may name that user, or be
// left out).
//
// The launcher switches to the identity in the child before exec (setgroups, setgid, setuid), and
// the supervisor gives the job's directories it creates (work dir, checkpoint folder) to it.
//
// Threading: ResolveRankUser reads the user database (getpwnam_r); thread-safe.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::worker {

struct RankIdentity {
  std::string name;  // for logs
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups of the user
  // Whether the launcher must switch to this identity (false: ranks run as the worker does).
  bool switch_user = false;
};

inline constexpr char kDefaultRankUser[] = "nobody";

// Resolves --rank-user (`flag`, empty when not given) for a worker whose effective uid is
// `worker_euid`. INVALID_ARGUMENT naming --rank-user for an unknown user, or for another user
// when the worker is not root.
absl::StatusOr<RankIdentity> ResolveRankUser(const std::string& flag, uid_t worker_euid);

}  // namespace loom::worker
