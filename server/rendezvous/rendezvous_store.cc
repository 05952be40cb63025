#include "server/rendezvous/rendezvous_store.h"

#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace loom::rendezvous {
namespace {

absl::Status CheckKey(const std::string& key, std::string_view field) {
  if (key.empty() || key.size() > kMaxKeyLength) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(field), " must be 1..",
                                                   kMaxKeyLength, " characters long (got ",
                                                   key.size(), ")"));
  }
  return absl::OkStatus();
}

// Quotes at most the first few missing keys so that an error message stays short.
std::string DescribeMissing(const std::vector<std::string>& missing) {
  constexpr size_t kShown = 8;
  std::vector<std::string> shown;
  for (size_t i = 0; i < missing.size() && i < kShown; ++i) {
    shown.push_back(absl::StrCat("\"", missing[i], "\""));
  }
  std::string out = absl::StrJoin(shown, ", ");
  if (missing.size() > kShown) absl::StrAppend(&out, " and ", missing.size() - kShown, " more");
  return out;
}

}  // namespace

RendezvousStore::RendezvousStore(ScopeChecker checker) : checker_(std::move(checker)) {}

absl::Status RendezvousStore::CheckScope(const v1::RendezvousScope& scope) const {
  constexpr absl::string_view kPrefix = "jobs/";
  if (!absl::StartsWith(scope.job(), kPrefix) || scope.job().size() == kPrefix.size()) {
    return absl::InvalidArgumentError(absl::StrCat("scope.job must look like jobs/{job} (got \"",
                                                   scope.job(), "\"); ranks find it in LOOM_JOB"));
  }
  if (scope.generation() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("scope.generation must be > 0 (got ",
                                                   scope.generation(),
                                                   "); ranks find it in LOOM_JOB_GENERATION"));
  }
  if (checker_) return checker_(scope.job(), scope.generation());
  return absl::OkStatus();
}

absl::Status RendezvousStore::PutLocked(const ScopeKey& scope_key, const std::string& key,
                                        std::string value) {
  Scope& scope = scopes_[scope_key];
  if (scope.epoch == 0) scope.epoch = next_epoch_++;
  auto it = scope.values.find(key);
  const size_t old_bytes = it == scope.values.end() ? 0 : it->first.size() + it->second.size();
  const size_t new_bytes = key.size() + value.size();
  if (it == scope.values.end() && scope.values.size() >= kMaxKeysPerScope) {
    return absl::ResourceExhaustedError(
        absl::StrCat("scope ", scope_key.first, " generation ", scope_key.second, " already holds ",
                     kMaxKeysPerScope, " keys; reuse keys instead of creating new ones"));
  }
  if (scope.bytes - old_bytes + new_bytes > kMaxScopeBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "scope ", scope_key.first, " generation ", scope_key.second, " would hold over ",
        kMaxScopeBytes >> 20, " MiB (its quota); values are meant for small bootstrap data"));
  }
  if (total_bytes_ - old_bytes + new_bytes > kMaxTotalBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the rendezvous store is full (", kMaxTotalBytes >> 20,
                     " MiB); values are meant for small bootstrap data"));
  }
  total_bytes_ = total_bytes_ - old_bytes + new_bytes;
  scope.bytes = scope.bytes - old_bytes + new_bytes;
  scope.values[key] = std::move(value);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::Status RendezvousStore::Set(const v1::RendezvousScope& scope, const std::string& key,
                                  std::string value) {
  RETURN_IF_ERROR(CheckKey(key, "key"));
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("value must be at most ", kMaxValueBytes, " bytes (got ", value.size(), ")"));
  }
  RETURN_IF_ERROR(CheckScope(scope));
  absl::MutexLock lock(&mu_);
  return PutLocked({scope.job(), scope.generation()}, key, std::move(value));
}

absl::StatusOr<std::string> RendezvousStore::Get(const v1::RendezvousScope& scope,
                                                 const std::string& key) {
  RETURN_IF_ERROR(CheckKey(key, "key"));
  RETURN_IF_ERROR(CheckScope(scope));
  absl::MutexLock lock(&mu_);
  auto it = scopes_.find({scope.job(), scope.generation()});
  if (it != scopes_.end()) {
    auto value = it->second.values.find(key);
    if (value != it->second.values.end()) return value->second;
  }
  return absl::NotFoundError(absl::StrCat("key \"", key, "\" is not set in ", scope.job(),
                                          " generation ", scope.generation(),
                                          "; use Wait to block until it is"));
}

absl::StatusOr<std::vector<std::string>> RendezvousStore::Wait(
    const v1::RendezvousScope& scope, const std::vector<std::string>& keys, absl::Duration timeout,
    const std::function<bool()>& cancelled) {
  if (keys.empty() || keys.size() > static_cast<size_t>(kMaxWaitKeys)) {
    return absl::InvalidArgumentError(
        absl::StrCat("keys must hold 1..", kMaxWaitKeys, " keys (got ", keys.size(), ")"));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    RETURN_IF_ERROR(CheckKey(keys[i], absl::StrCat("keys[", i, "]")));
  }
  if (timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeout_ms must be >= 0 (0 means the default, 300000)");
  }
  if (timeout == absl::ZeroDuration()) timeout = kDefaultWaitTimeout;
  if (timeout > kMaxWaitTimeout) timeout = kMaxWaitTimeout;
  RETURN_IF_ERROR(CheckScope(scope));

  const absl::Time deadline = absl::Now() + timeout;
  const ScopeKey scope_key{scope.job(), scope.generation()};
  absl::MutexLock lock(&mu_);
  // Create the scope so that a drop while we wait is visible as a change of epoch.
  Scope& created = scopes_[scope_key];
  if (created.epoch == 0) created.epoch = next_epoch_++;
  const uint64_t epoch = created.epoch;
  while (true) {
    if (shutdown_) return absl::CancelledError("loomd is shutting down");
    auto it = scopes_.find(scope_key);
    if (it == scopes_.end() || it->second.epoch != epoch) {
      return absl::AbortedError(absl::StrCat(scope.job(), " generation ", scope.generation(),
                                             " ended while waiting; the gang is being stopped"));
    }
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      if (!it->second.values.contains(key)) missing.push_back(key);
    }
    if (missing.empty()) {
      std::vector<std::string> values;
      values.reserve(keys.size());
      for (const std::string& key : keys) values.push_back(it->second.values.find(key)->second);
      return values;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("timed out after ", absl::FormatDuration(timeout), " waiting for ",
                       missing.size(), " of ", keys.size(), " keys: ", DescribeMissing(missing)));
    }
    if (cancelled && cancelled()) return absl::CancelledError("the client cancelled the wait");
    changed_.WaitWithTimeout(&mu_, std::min(deadline - now, absl::Milliseconds(100)));
  }
}

absl::StatusOr<int64_t> RendezvousStore::Add(const v1::RendezvousScope& scope,
                                             const std::string& key, int64_t delta) {
  RETURN_IF_ERROR(CheckKey(key, "key"));
  RETURN_IF_ERROR(CheckScope(scope));
  absl::MutexLock lock(&mu_);
  const ScopeKey scope_key{scope.job(), scope.generation()};
  int64_t current = 0;
  auto it = scopes_.find(scope_key);
  if (it != scopes_.end()) {
    auto value = it->second.values.find(key);
    if (value != it->second.values.end() && !absl::SimpleAtoi(value->second, &current)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "key \"", key, "\" holds a value that is not a decimal integer; Add needs a counter"));
    }
  }
  if ((delta > 0 && current > std::numeric_limits<int64_t>::max() - delta) ||
      (delta < 0 && current < std::numeric_limits<int64_t>::min() - delta)) {
    return absl::OutOfRangeError(absl::StrCat("adding ", delta, " to key \"", key, "\" (", current,
                                              ") overflows a 64-bit integer"));
  }
  const int64_t next = current + delta;
  RETURN_IF_ERROR(PutLocked(scope_key, key, absl::StrCat(next)));
  return next;
}

void RendezvousStore::DropJob(std::string_view job, int64_t keep_from_generation) {
  absl::MutexLock lock(&mu_);
  auto it = scopes_.lower_bound({std::string(job), std::numeric_limits<int64_t>::min()});
  bool dropped = false;
  while (it != scopes_.end() && it->first.first == job && it->first.second < keep_from_generation) {
    for (const auto& [key, value] : it->second.values) total_bytes_ -= key.size() + value.size();
    it = scopes_.erase(it);
    dropped = true;
  }
  if (dropped) changed_.SignalAll();
}

void RendezvousStore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  changed_.SignalAll();
}

size_t RendezvousStore::ScopeCount() const {
  absl::MutexLock lock(&mu_);
  return scopes_.size();
}

}  // namespace loom::rendezvous
