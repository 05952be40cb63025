// Who is calling loomd: the result of authentication, the input of every authorization check.
#pragma once

#include <string>

namespace loom::auth {

// The tenant of every caller where loomd authenticates nobody, and of jobs stored before tenants.
inline constexpr char kDefaultTenant[] = "default";

enum class Role {
  kUser,   // owns jobs of its tenant
  kAdmin,  // sees and cancels every tenant's jobs, manages nodes; never reads another's env
  kNode,   // a worker: registers a node and holds its session
};

struct Principal {
  Role role = Role::kUser;
  // kUser/kAdmin: the tenant ([a-z0-9-], at most 63 characters); the jobs a user creates belong
  // to it. kNode: the node id this credential may register, or "*" for any node id.
  std::string subject;
  // How the caller proved it: "token", "certificate", or "open" (no authentication configured:
  // loopback development only, where every caller is admin of tenant "default").
  std::string method;

  bool is_admin() const { return role == Role::kAdmin; }
  // Users and admins act on jobs; nodes do not.
  bool is_person() const { return role == Role::kUser || role == Role::kAdmin; }
  // Whether this principal may register/hold a session for `node_id`.
  bool may_be_node(const std::string& node_id) const {
    return role == Role::kNode && (subject == "*" || subject == node_id);
  }
};

const char* RoleName(Role role);

}  // namespace loom::auth
