#include "server/store/job_store.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace loom::store {

std::string RequestKey(absl::string_view tenant, absl::string_view request_id) {
  // Tenants are [a-z0-9-], so "/" cannot be part of one: keys of two tenants never collide.
  if (tenant.empty() || tenant == "default") return std::string(request_id);
  return absl::StrCat(tenant, "/", request_id);
}

absl::Status CheckRequestId(absl::string_view request_id) {
  if (request_id.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id must be at most 128 characters (got ", request_id.size(),
                     "); a UUID is a good choice"));
  }
  if (absl::StrContains(request_id, '/')) {
    return absl::InvalidArgumentError(
        "request_id must not contain '/' (it separates the tenant in the idempotency key); a "
        "UUID is a good choice");
  }
  return absl::OkStatus();
}

bool SameTenant(absl::string_view a, absl::string_view b) {
  auto normal = [](absl::string_view t) { return t.empty() ? absl::string_view("default") : t; };
  return normal(a) == normal(b);
}

}  // namespace loom::store
