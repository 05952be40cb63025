// The in-memory ScaleTestStore (tests): a map behind a mutex, the same contract as SQLite's.
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/scaling/scale_test_store.h"

namespace loom::scaling {
namespace {

class MemoryScaleTestStore final : public ScaleTestStore {
 public:
  absl::StatusOr<int64_t> Create(const v1::ScaleTest& test,
                                 const std::string& request_key) override {
    if (test.name().empty()) return absl::InvalidArgumentError("a scale test needs a name");
    absl::MutexLock lock(&mu_);
    for (const auto& [seq, row] : rows_) {
      if (row.stored.test.name() == test.name() ||
          (!request_key.empty() && row.request_key == request_key)) {
        return absl::AlreadyExistsError(
            absl::StrCat("scale test ", test.name(), " or its request_id already exists"));
      }
    }
    const int64_t sequence = ++last_sequence_;
    rows_[sequence] = Row{StoredScaleTest{sequence, test}, request_key};
    return sequence;
  }

  absl::Status Update(const v1::ScaleTest& test) override {
    absl::MutexLock lock(&mu_);
    for (auto& [seq, row] : rows_) {
      if (row.stored.test.name() == test.name()) {
        row.stored.test = test;
        return absl::OkStatus();
      }
    }
    return absl::NotFoundError(absl::StrCat("scale test ", test.name(), " not found"));
  }

  absl::StatusOr<StoredScaleTest> Get(std::string_view name) override {
    absl::MutexLock lock(&mu_);
    for (const auto& [seq, row] : rows_) {
      if (row.stored.test.name() == name) return row.stored;
    }
    return absl::NotFoundError(absl::StrCat("scale test ", std::string(name), " not found"));
  }

  absl::StatusOr<std::optional<StoredScaleTest>> FindByRequestKey(
      std::string_view request_key) override {
    absl::MutexLock lock(&mu_);
    if (request_key.empty()) return std::optional<StoredScaleTest>();
    for (const auto& [seq, row] : rows_) {
      if (row.request_key == request_key) return std::optional<StoredScaleTest>(row.stored);
    }
    return std::optional<StoredScaleTest>();
  }

  absl::StatusOr<ScaleTestPage> List(int64_t after_sequence, int limit,
                                     const std::optional<std::string>& tenant) override {
    absl::MutexLock lock(&mu_);
    ScaleTestPage page;
    for (auto it = rows_.upper_bound(after_sequence); it != rows_.end(); ++it) {
      if (tenant.has_value() && it->second.stored.test.tenant() != *tenant) continue;
      if (static_cast<int>(page.tests.size()) == limit) {
        page.has_more = true;
        break;
      }
      page.tests.push_back(it->second.stored);
    }
    return page;
  }

  absl::StatusOr<std::vector<StoredScaleTest>> ListRunning() override {
    absl::MutexLock lock(&mu_);
    std::vector<StoredScaleTest> out;
    for (const auto& [seq, row] : rows_) {
      if (row.stored.test.state() == v1::SCALE_TEST_RUNNING) out.push_back(row.stored);
    }
    return out;
  }

 private:
  struct Row {
    StoredScaleTest stored;
    std::string request_key;
  };
  absl::Mutex mu_;
  std::map<int64_t, Row> rows_ ABSL_GUARDED_BY(mu_);
  int64_t last_sequence_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::unique_ptr<ScaleTestStore> NewMemoryScaleTestStore() {
  return std::make_unique<MemoryScaleTestStore>();
}

}  // namespace loom::scaling
