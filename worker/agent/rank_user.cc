#include "worker/agent/rank_user.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/echo.h"

namespace loom::worker {
namespace {

absl::Status Invalid(const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("--rank-user: ", message));
}

// The passwd entry of `name` (a user name or a numeric uid); INVALID_ARGUMENT when none.
absl::StatusOr<RankIdentity> LookUp(const std::string& name) {
  passwd entry{};
  passwd* found = nullptr;
  std::vector<char> buffer(16384);
  int rc = ::getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
  if (rc == 0 && found == nullptr && !name.empty() &&
      name.find_first_not_of("0123456789") == std::string::npos && name.size() < 10) {
    rc = ::getpwuid_r(static_cast<uid_t>(std::strtoul(name.c_str(), nullptr, 10)), &entry,
                      buffer.data(), buffer.size(), &found);
  }
  if (rc != 0 || found == nullptr) {
    return Invalid(absl::StrCat("no user ", Echo(name),
                                " on this node; name an existing unprivileged user (default ",
                                kDefaultRankUser, ")"));
  }
  RankIdentity id;
  id.name = found->pw_name;
  id.uid = found->pw_uid;
  id.gid = found->pw_gid;
  int count = 64;
  std::vector<gid_t> groups(count);
  if (::getgrouplist(found->pw_name, found->pw_gid, groups.data(), &count) < 0) {
    groups.resize(count);
    if (::getgrouplist(found->pw_name, found->pw_gid, groups.data(), &count) < 0) count = 0;
  }
  groups.resize(count);
  id.groups = std::move(groups);
  if (id.groups.empty()) id.groups.push_back(id.gid);
  return id;
}

}  // namespace

absl::StatusOr<RankIdentity> ResolveRankUser(const std::string& flag, uid_t worker_euid) {
  if (worker_euid != 0) {
    RankIdentity self;
    self.uid = worker_euid;
    self.gid = ::getegid();
    self.switch_user = false;
    if (flag.empty()) {
      self.name = absl::StrCat("uid ", worker_euid);
      return self;
    }
    absl::StatusOr<RankIdentity> wanted = LookUp(flag);
    if (!wanted.ok()) return wanted.status();
    if (wanted->uid != worker_euid) {
      return Invalid(absl::StrCat("running ranks as ", Echo(flag),
                                  " needs loom-worker to run as root; leave the flag out to run "
                                  "them as the worker's own user"));
    }
    self.name = wanted->name;
    return self;
  }
  absl::StatusOr<RankIdentity> id = LookUp(flag.empty() ? kDefaultRankUser : flag);
  if (!id.ok()) return id.status();
  id->switch_user = id->uid != 0;
  return id;
}

}  // namespace loom::worker
