// Placeholder until the SQLite store lands (same session): keeps loom_store linkable.
#include "server/store/job_store.h"

namespace loom::store {

absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteJobStore(const std::string& path) {
  return absl::UnimplementedError("SqliteJobStore is not implemented yet");
}

}  // namespace loom::store
