#include "server/store/job_store.h"

#include "absl/strings/str_cat.h"

namespace loom::store {

std::string RequestKey(absl::string_view tenant, absl::string_view request_id) {
  // Tenants are [a-z0-9-], so "/" cannot be part of one: keys of two tenants never collide.
  if (tenant.empty() || tenant == "default") return std::string(request_id);
  return absl::StrCat(tenant, "/", request_id);
}

}  // namespace loom::store
