// RendezvousStore: the key-value store with wait behind RendezvousService. The ranks of a job use
// it to bootstrap their communicators (NCCL unique ids, Gloo's store). Every key lives in a scope
// (job, generation), so a restarted gang never reads what an earlier generation wrote; the job
// manager drops a scope's entries when its job moves to a newer generation or ends.
//
// Threading: every method is thread-safe. Wait() blocks the calling thread (one gRPC handler
// thread per waiting rank) on a condition variable that Set() and Add() signal; it never holds
// the lock while calling the scope checker, so the checker may take other locks (the job
// manager's) without ordering problems.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "loom/v1/rendezvous.pb.h"

namespace loom::rendezvous {

// Limits of the API (documented in rendezvous.proto) and of the store's memory.
inline constexpr size_t kMaxKeyLength = 512;
inline constexpr size_t kMaxValueBytes = 1 << 20;
inline constexpr int kMaxWaitKeys = 4096;
inline constexpr size_t kMaxKeysPerScope = 65536;
// Bytes (keys + values) one (job, generation) may hold: far above what a gang's bootstrap needs
// (an NCCL id is 128 bytes, Gloo's store a few hundred bytes per rank and context), and small
// enough that one job cannot fill the store and starve every other job's start.
inline constexpr size_t kMaxScopeBytes = size_t{16} << 20;
inline constexpr size_t kMaxTotalBytes = size_t{512} << 20;
inline constexpr absl::Duration kDefaultWaitTimeout = absl::Milliseconds(300000);
inline constexpr absl::Duration kMaxWaitTimeout = absl::Hours(24);

// Decides whether a well-formed scope may be used: OK, NOT_FOUND (no such job) or
// FAILED_PRECONDITION (the job ended or is at another generation). Called without the store's
// lock held.
using ScopeChecker = std::function<absl::Status(std::string_view job, int64_t generation)>;

class RendezvousStore {
 public:
  // `checker` may be empty (every well-formed scope is accepted), e.g. in tests.
  explicit RendezvousStore(ScopeChecker checker);
  RendezvousStore(const RendezvousStore&) = delete;
  RendezvousStore& operator=(const RendezvousStore&) = delete;

  // Sets `key` to `value` in `scope`, replacing any earlier value, and wakes the waiters.
  // INVALID_ARGUMENT for a malformed scope, key or value; RESOURCE_EXHAUSTED when the scope or
  // the whole store is full; the checker's error otherwise.
  absl::Status Set(const v1::RendezvousScope& scope, const std::string& key, std::string value);

  // The value of `key`; NOT_FOUND when it is not set.
  absl::StatusOr<std::string> Get(const v1::RendezvousScope& scope, const std::string& key);

  // Blocks until every key is set and returns their values in the order of `keys`.
  // `timeout` <= 0 means the default (300 s). DEADLINE_EXCEEDED names the missing keys;
  // CANCELLED when `cancelled` (polled about every 100 ms; may be empty) returns true or the
  // store shuts down; ABORTED when the scope is dropped while waiting (the job moved on).
  absl::StatusOr<std::vector<std::string>> Wait(const v1::RendezvousScope& scope,
                                                const std::vector<std::string>& keys,
                                                absl::Duration timeout,
                                                const std::function<bool()>& cancelled);

  // Adds `delta` to the counter `key` (stored as decimal text, absent = 0) and returns the new
  // value. FAILED_PRECONDITION when the key holds something that is not an integer;
  // OUT_OF_RANGE on overflow.
  absl::StatusOr<int64_t> Add(const v1::RendezvousScope& scope, const std::string& key,
                              int64_t delta);

  // Drops every scope of `job` whose generation is below `keep_from_generation` (0 or less:
  // drops none; INT64_MAX: drops all) and wakes their waiters with ABORTED.
  void DropJob(std::string_view job, int64_t keep_from_generation);

  // Wakes every waiter with CANCELLED and refuses new waits; for server shutdown.
  void Shutdown();

  // Number of scopes held (for tests and metrics).
  size_t ScopeCount() const;

 private:
  using ScopeKey = std::pair<std::string, int64_t>;  // (job, generation)
  struct Scope {
    std::map<std::string, std::string, std::less<>> values;
    size_t bytes = 0;  // keys + values held
    uint64_t epoch = 0;  // which incarnation of the scope; a dropped scope gets a new one
  };

  // Validates the scope's form and asks the checker.
  absl::Status CheckScope(const v1::RendezvousScope& scope) const;
  // Puts `value` under `key`, enforcing the memory limits. Requires mu_.
  absl::Status PutLocked(const ScopeKey& scope, const std::string& key, std::string value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ScopeChecker checker_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;  // signalled on every Set, Add, DropJob and Shutdown
  std::map<ScopeKey, Scope> scopes_ ABSL_GUARDED_BY(mu_);
  size_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_epoch_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace loom::rendezvous
