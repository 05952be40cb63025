// ScaleTestStore: the durable side of scaling sweeps (scaletests/{id}). Two implementations:
// SQLite (a table in loomd's database, beside the job store's, created when missing like the
// calibration tables) and in memory (tests). Every method is thread-safe; a write that fails
// changes nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loom/v1/scaling.pb.h"

namespace loom::scaling {

struct StoredScaleTest {
  int64_t sequence = 0;  // insertion order: orders lists and backs page tokens
  v1::ScaleTest test;
};

struct ScaleTestPage {
  std::vector<StoredScaleTest> tests;  // ascending sequence
  bool has_more = false;
};

class ScaleTestStore {
 public:
  virtual ~ScaleTestStore() = default;
  // Inserts a new sweep; returns its sequence. ALREADY_EXISTS when the name, or a non-empty
  // `request_key` (tenant-scoped idempotency key, store::RequestKey), is taken.
  virtual absl::StatusOr<int64_t> Create(const v1::ScaleTest& test,
                                         const std::string& request_key) = 0;
  // Replaces the stored sweep of test.name(); NOT_FOUND when there is none.
  virtual absl::Status Update(const v1::ScaleTest& test) = 0;
  // NOT_FOUND when there is none.
  virtual absl::StatusOr<StoredScaleTest> Get(std::string_view name) = 0;
  virtual absl::StatusOr<std::optional<StoredScaleTest>> FindByRequestKey(
      std::string_view request_key) = 0;
  // Up to `limit` (>= 1) sweeps with sequence > after_sequence, ascending, only `tenant`'s when
  // given.
  virtual absl::StatusOr<ScaleTestPage> List(int64_t after_sequence, int limit,
                                             const std::optional<std::string>& tenant) = 0;
  // Every sweep in SCALE_TEST_RUNNING, ascending sequence (start-up recovery).
  virtual absl::StatusOr<std::vector<StoredScaleTest>> ListRunning() = 0;
};

// Opens the scale_tests table of loomd's SQLite database at `path`, creating it when missing
// (an older database gains it; its schema version is untouched). The file must already be a
// Loom database (store::OpenSqliteJobStore first); FAILED_PRECONDITION naming the path otherwise.
absl::StatusOr<std::unique_ptr<ScaleTestStore>> OpenSqliteScaleTestStore(const std::string& path);

std::unique_ptr<ScaleTestStore> NewMemoryScaleTestStore();

}  // namespace loom::scaling
