// MemoryJobStore: the JobStore contract kept in process memory, for manager tests and for
// running loomd without a state dir. It follows the same conformance suite as SqliteJobStore
// (tests/server/store_conformance_test.cc), so code tested against it behaves the same on disk.
//
// Threading: every method takes `mu_`; a method either completes all its writes under the lock
// or, on error, makes none, which gives the same atomicity as one SQLite transaction.
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "server/store/job_store.h"
#include "server/store/store_checks.h"

namespace loom::store {
namespace {

class MemoryJobStore final : public JobStore {
 public:
  absl::StatusOr<int64_t> CreateJob(const v1::Job& job, const v1::JobEvent& first_event) override {
    RETURN_IF_ERROR(CheckJobForWrite(job));
    absl::MutexLock lock(&mu_);
    if (by_name_.count(job.name()) > 0) {
      return absl::AlreadyExistsError(absl::StrCat("job ", job.name(), " already exists"));
    }
    if (!job.request_id().empty() && by_request_id_.count(RequestKey(job)) > 0) {
      return absl::AlreadyExistsError(absl::StrCat("request_id \"", job.request_id(),
                                                   "\" was already used to create job ",
                                                   by_request_id_.find(RequestKey(job))->second));
    }
    const int64_t sequence = ++last_sequence_;
    Entry& entry = jobs_[sequence];
    entry.job = StripEvents(job);
    v1::JobEvent event = first_event;
    event.set_sequence(1);
    entry.events.push_back(std::move(event));
    by_name_[job.name()] = sequence;
    if (!job.request_id().empty()) by_request_id_.emplace(RequestKey(job), job.name());
    return sequence;
  }

  absl::StatusOr<StoredJob> GetJob(std::string_view name) override {
    absl::MutexLock lock(&mu_);
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return NotFound(name);
    return StoredJob{it->second, jobs_.at(it->second).job};
  }

  absl::StatusOr<std::optional<StoredJob>> FindJobByRequestId(
      std::string_view request_id) override {
    absl::MutexLock lock(&mu_);
    if (request_id.empty()) return std::optional<StoredJob>();
    auto it = by_request_id_.find(request_id);
    if (it == by_request_id_.end()) return std::optional<StoredJob>();
    const int64_t sequence = by_name_.at(it->second);
    return std::optional<StoredJob>(StoredJob{sequence, jobs_.at(sequence).job});
  }

  absl::StatusOr<JobPage> ListJobs(std::optional<v1::JobState> state, int64_t after_sequence,
                                   int limit) override {
    RETURN_IF_ERROR(CheckListLimit(limit));
    absl::MutexLock lock(&mu_);
    JobPage page;
    for (auto it = jobs_.upper_bound(after_sequence); it != jobs_.end(); ++it) {
      if (state.has_value() && it->second.job.state() != *state) continue;
      if (static_cast<int>(page.jobs.size()) == limit) {
        page.has_more = true;
        break;
      }
      page.jobs.push_back(StoredJob{it->first, it->second.job});
    }
    return page;
  }

  using JobStore::UpdateJob;
  absl::Status UpdateJob(const v1::Job& job, const std::optional<v1::JobEvent>& event,
                         Durability /*memory has no disk*/) override {
    RETURN_IF_ERROR(CheckJobForWrite(job));
    absl::MutexLock lock(&mu_);
    auto it = by_name_.find(job.name());
    if (it == by_name_.end()) return NotFound(job.name());
    Entry& entry = jobs_.at(it->second);
    v1::Job stored = StripEvents(job);
    // The idempotency key is fixed at creation (it is indexed); an update cannot move it.
    stored.set_request_id(entry.job.request_id());
    entry.job = std::move(stored);
    if (event.has_value()) {
      v1::JobEvent appended = *event;
      appended.set_sequence(static_cast<int64_t>(entry.events.size()) + 1);
      entry.events.push_back(std::move(appended));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(std::string_view name) override {
    absl::MutexLock lock(&mu_);
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return NotFound(name);
    return jobs_.at(it->second).events;
  }

  absl::StatusOr<std::vector<StoredJob>> ListActiveJobs() override {
    absl::MutexLock lock(&mu_);
    std::vector<StoredJob> active;
    for (const auto& [sequence, entry] : jobs_) {
      if (IsActiveState(entry.job.state())) active.push_back(StoredJob{sequence, entry.job});
    }
    return active;
  }

  absl::Status PutNode(const v1::Node& node) override {
    RETURN_IF_ERROR(CheckNodeForWrite(node));
    absl::MutexLock lock(&mu_);
    nodes_[node.name()] = node;
    return absl::OkStatus();
  }

  absl::Status DeleteNode(std::string_view name) override {
    absl::MutexLock lock(&mu_);
    if (nodes_.erase(std::string(name)) == 0) {
      return absl::NotFoundError(absl::StrCat("node ", std::string(name), " not found"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<v1::Node>> ListNodes() override {
    absl::MutexLock lock(&mu_);
    std::vector<v1::Node> nodes;
    nodes.reserve(nodes_.size());
    for (const auto& [name, node] : nodes_) nodes.push_back(node);
    return nodes;
  }

 private:
  struct Entry {
    v1::Job job;                       // without events
    std::vector<v1::JobEvent> events;  // events[i].sequence() == i + 1
  };

  static absl::Status NotFound(std::string_view name) {
    return absl::NotFoundError(absl::StrCat("job ", std::string(name), " not found"));
  }

  absl::Mutex mu_;
  int64_t last_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, Entry> jobs_ ABSL_GUARDED_BY(mu_);  // by sequence: ListJobs order
  std::map<std::string, int64_t, std::less<>> by_name_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string, std::less<>> by_request_id_ ABSL_GUARDED_BY(mu_);  // → name
  std::map<std::string, v1::Node> nodes_ ABSL_GUARDED_BY(mu_);  // by name: ListNodes order
};

}  // namespace

std::unique_ptr<JobStore> NewMemoryJobStore() { return std::make_unique<MemoryJobStore>(); }

}  // namespace loom::store
