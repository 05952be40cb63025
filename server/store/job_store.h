// JobStore: the durable state of loomd (jobs, their append-only event logs, and known nodes).
// Two implementations share one conformance test: SqliteJobStore (WAL mode, the production
// store) and MemoryJobStore (for manager tests). Every method is thread-safe. A method that
// fails changes nothing: writes are atomic (one SQLite transaction each).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"

namespace loom::store {

// A job as stored: the Job message (without `events`, which live in their own log) and the
// store-assigned insertion sequence that orders ListJobs and backs its page tokens.
struct StoredJob {
  int64_t sequence = 0;
  v1::Job job;
};

struct JobPage {
  std::vector<StoredJob> jobs;  // ascending sequence
  bool has_more = false;        // another page follows the last job of this one
};

// The key under which a job's idempotency key is unique: request ids are per tenant, so that one
// tenant's CreateJob can never return another tenant's job. Jobs of the "default" tenant (and
// those stored before tenants existed) keep the bare request id.
std::string RequestKey(absl::string_view tenant, absl::string_view request_id);
inline std::string RequestKey(const v1::Job& job) {
  return RequestKey(job.tenant(), job.request_id());
}

// Checks an idempotency key a caller chose: at most 128 characters and no "/", the separator
// RequestKey puts after the tenant (a default-tenant id "alice/x" would otherwise be tenant
// alice's key "x"). INVALID_ARGUMENT naming request_id and the fix.
absl::Status CheckRequestId(absl::string_view request_id);

// Whether two stored tenant names are one tenant ("" is "default", as for jobs stored before
// tenants existed).
bool SameTenant(absl::string_view a, absl::string_view b);

// How durable a write is when the call returns.
enum class Durability {
  // On disk (the WAL synced): survives a power loss. Everything loomd acknowledges or acts on.
  kSynced,
  // Committed and visible, and it survives a crash of loomd (kill -9), but it reaches the disk
  // with the next synced write or checkpoint: a power loss may take it back. Only for what loomd
  // learns again from its workers after a restart (a gang became RUNNING, its progress).
  kDeferred,
};

class JobStore {
 public:
  virtual ~JobStore() = default;

  // Inserts a new job (job.name() is "jobs/{id}", unique) and its first event, atomically.
  // Returns the assigned sequence (strictly increasing across calls). ALREADY_EXISTS if the name
  // or a non-empty job.request_id() is already taken within the job's tenant (RequestKey); then
  // nothing is written.
  virtual absl::StatusOr<int64_t> CreateJob(const v1::Job& job,
                                            const v1::JobEvent& first_event) = 0;

  // NOT_FOUND if no job has this name ("jobs/{id}").
  virtual absl::StatusOr<StoredJob> GetJob(std::string_view name) = 0;

  // The job created with this idempotency key (a RequestKey), or nullopt.
  virtual absl::StatusOr<std::optional<StoredJob>> FindJobByRequestId(
      std::string_view request_id) = 0;

  // Up to `limit` (>= 1) jobs with sequence > after_sequence, ascending, optionally only those
  // in `state`. Jobs inserted concurrently get larger sequences, so paging never skips or
  // repeats a job.
  virtual absl::StatusOr<JobPage> ListJobs(std::optional<v1::JobState> state,
                                           int64_t after_sequence, int limit) = 0;

  // Replaces the stored job (matched by job.name()) and, when `event` is given, appends it to
  // the job's event log, atomically. The event's `sequence` is assigned by the store
  // (1, 2, 3 ... per job). NOT_FOUND if the job does not exist. Synced unless `durability` says
  // otherwise.
  virtual absl::Status UpdateJob(const v1::Job& job, const std::optional<v1::JobEvent>& event,
                                 Durability durability) = 0;
  absl::Status UpdateJob(const v1::Job& job, const std::optional<v1::JobEvent>& event) {
    return UpdateJob(job, event, Durability::kSynced);
  }

  // The job's event log, oldest first. NOT_FOUND if the job does not exist.
  virtual absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(std::string_view name) = 0;

  // Every job not in a terminal state (QUEUED, SCHEDULED, RUNNING, RESTARTING), ascending
  // sequence; used at start-up to rebuild the manager's view.
  virtual absl::StatusOr<std::vector<StoredJob>> ListActiveJobs() = 0;

  // Inserts or replaces a node (matched by node.name(), "nodes/{id}").
  virtual absl::Status PutNode(const v1::Node& node) = 0;
  virtual absl::StatusOr<std::vector<v1::Node>> ListNodes() = 0;
  // Removes the node named `name`; NOT_FOUND when there is none.
  virtual absl::Status DeleteNode(std::string_view name) = 0;
};

// Opens (creating if needed) the SQLite database `path` in WAL mode with its schema.
// A file that is not a Loom database gives FAILED_PRECONDITION naming the path.
absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteJobStore(const std::string& path);

std::unique_ptr<JobStore> NewMemoryJobStore();

}  // namespace loom::store
