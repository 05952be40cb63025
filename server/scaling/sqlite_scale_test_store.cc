// The SQLite ScaleTestStore: one table in loomd's database (loomd.db under --state-dir).
//
// Schema, created with CREATE TABLE IF NOT EXISTS when the store opens (as the calibration
// tables are), so that a database written before sweeps existed gains the table without a
// migration and stays readable by an older loomd (SQLite ignores tables nobody queries):
//   scale_tests(sequence INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT UNIQUE, tenant TEXT,
//               request_key TEXT (NULL when absent; unique among non-NULL), state INTEGER,
//               scale_test BLOB = v1::ScaleTest)
//
// Durability and atomicity as the job store: WAL (set on the file by the job store),
// synchronous=FULL on this connection, one transaction per call.
//
// Threading: one connection behind a mutex; a sweep is written a few times per size.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "server/scaling/scale_test_store.h"
#include "server/store/sqlite_connection.h"

namespace loom::scaling {
namespace {

using store::SqliteConnection;
using store::Statement;

// The job store's mark of a Loom database (server/store/sqlite_job_store.cc): "LOOM".
constexpr int64_t kLoomApplicationId = 0x4C4F4F4D;

constexpr std::string_view kSchema = R"sql(
CREATE TABLE IF NOT EXISTS scale_tests (
  sequence    INTEGER PRIMARY KEY AUTOINCREMENT,
  name        TEXT    NOT NULL UNIQUE,
  tenant      TEXT    NOT NULL,
  request_key TEXT,
  state       INTEGER NOT NULL,
  scale_test  BLOB    NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS scale_tests_by_request_key
  ON scale_tests(request_key) WHERE request_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS scale_tests_by_state ON scale_tests(state, sequence);
)sql";

absl::StatusOr<StoredScaleTest> ReadRow(const Statement& row, const std::string& path) {
  StoredScaleTest out;
  out.sequence = row.ColumnInt(0);
  const std::string_view bytes = row.ColumnBytes(1);
  if (!out.test.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(absl::StrCat("SQLite database ", path,
                                            ": a stored scale test does not parse as ",
                                            out.test.GetTypeName(), "; the file is damaged"));
  }
  return out;
}

class SqliteScaleTestStore final : public ScaleTestStore {
 public:
  explicit SqliteScaleTestStore(std::unique_ptr<SqliteConnection> db) : db_(std::move(db)) {}

  absl::StatusOr<int64_t> Create(const v1::ScaleTest& test,
                                 const std::string& request_key) override {
    if (test.name().empty()) return absl::InvalidArgumentError("a scale test needs a name");
    const std::string bytes = test.SerializeAsString();
    int64_t sequence = 0;
    RETURN_IF_ERROR(Transaction("BEGIN IMMEDIATE", [&](SqliteConnection& db) -> absl::Status {
      {
        ASSIGN_OR_RETURN(Statement find,
                         db.Prepare("SELECT name FROM scale_tests WHERE name = ? OR "
                                    "(request_key IS NOT NULL AND request_key = ?)"));
        find.BindText(1, test.name());
        find.BindText(2, request_key);
        ASSIGN_OR_RETURN(const bool found, find.Step());
        if (found) {
          return absl::AlreadyExistsError(
              absl::StrCat("scale test ", test.name(), " or its request_id already exists"));
        }
      }
      ASSIGN_OR_RETURN(Statement insert,
                       db.Prepare("INSERT INTO scale_tests (name, tenant, request_key, state, "
                                  "scale_test) VALUES (?, ?, ?, ?, ?) RETURNING sequence"));
      insert.BindText(1, test.name());
      insert.BindText(2, test.tenant());
      insert.BindTextOrNull(3, request_key);
      insert.BindInt(4, test.state());
      insert.BindBlob(5, bytes);
      ASSIGN_OR_RETURN(const bool row, insert.Step());
      if (!row) return absl::InternalError("INSERT … RETURNING gave no row");
      sequence = insert.ColumnInt(0);
      return insert.Step().status();  // finish the statement
    }));
    return sequence;
  }

  absl::Status Update(const v1::ScaleTest& test) override {
    const std::string bytes = test.SerializeAsString();
    return Transaction("BEGIN IMMEDIATE", [&](SqliteConnection& db) -> absl::Status {
      ASSIGN_OR_RETURN(Statement update,
                       db.Prepare("UPDATE scale_tests SET state = ?, scale_test = ? WHERE name = ? "
                                  "RETURNING sequence"));
      update.BindInt(1, test.state());
      update.BindBlob(2, bytes);
      update.BindText(3, test.name());
      ASSIGN_OR_RETURN(const bool row, update.Step());
      if (!row) return absl::NotFoundError(absl::StrCat("scale test ", test.name(), " not found"));
      return update.Step().status();
    });
  }

  absl::StatusOr<StoredScaleTest> Get(std::string_view name) override {
    std::optional<StoredScaleTest> out;
    RETURN_IF_ERROR(Transaction("BEGIN", [&](SqliteConnection& db) -> absl::Status {
      ASSIGN_OR_RETURN(Statement find, db.Prepare("SELECT sequence, scale_test FROM scale_tests "
                                                  "WHERE name = ?"));
      find.BindText(1, name);
      ASSIGN_OR_RETURN(const bool row, find.Step());
      if (!row) return absl::OkStatus();
      ASSIGN_OR_RETURN(out, ReadRow(find, db.path()));
      return absl::OkStatus();
    }));
    if (!out.has_value()) {
      return absl::NotFoundError(absl::StrCat("scale test ", std::string(name), " not found"));
    }
    return *std::move(out);
  }

  absl::StatusOr<std::optional<StoredScaleTest>> FindByRequestKey(
      std::string_view request_key) override {
    std::optional<StoredScaleTest> out;
    if (request_key.empty()) return out;
    RETURN_IF_ERROR(Transaction("BEGIN", [&](SqliteConnection& db) -> absl::Status {
      ASSIGN_OR_RETURN(Statement find, db.Prepare("SELECT sequence, scale_test FROM scale_tests "
                                                  "WHERE request_key = ?"));
      find.BindText(1, request_key);
      ASSIGN_OR_RETURN(const bool row, find.Step());
      if (!row) return absl::OkStatus();
      ASSIGN_OR_RETURN(out, ReadRow(find, db.path()));
      return absl::OkStatus();
    }));
    return out;
  }

  absl::StatusOr<ScaleTestPage> List(int64_t after_sequence, int limit,
                                     const std::optional<std::string>& tenant) override {
    ScaleTestPage page;
    RETURN_IF_ERROR(Transaction("BEGIN", [&](SqliteConnection& db) -> absl::Status {
      ASSIGN_OR_RETURN(
          Statement list,
          db.Prepare(tenant.has_value()
                         ? "SELECT sequence, scale_test FROM scale_tests WHERE sequence > ? AND "
                           "tenant = ? ORDER BY sequence LIMIT ?"
                         : "SELECT sequence, scale_test FROM scale_tests WHERE sequence > ? "
                           "ORDER BY sequence LIMIT ?"));
      int next = 1;
      list.BindInt(next++, after_sequence);
      if (tenant.has_value()) list.BindText(next++, *tenant);
      list.BindInt(next++, static_cast<int64_t>(limit) + 1);
      while (true) {
        ASSIGN_OR_RETURN(const bool row, list.Step());
        if (!row) break;
        if (static_cast<int>(page.tests.size()) == limit) {
          page.has_more = true;
          continue;
        }
        ASSIGN_OR_RETURN(StoredScaleTest t, ReadRow(list, db.path()));
        page.tests.push_back(std::move(t));
      }
      return absl::OkStatus();
    }));
    return page;
  }

  absl::StatusOr<std::vector<StoredScaleTest>> ListRunning() override {
    std::vector<StoredScaleTest> out;
    RETURN_IF_ERROR(Transaction("BEGIN", [&](SqliteConnection& db) -> absl::Status {
      ASSIGN_OR_RETURN(Statement list, db.Prepare("SELECT sequence, scale_test FROM scale_tests "
                                                  "WHERE state = ? ORDER BY sequence"));
      list.BindInt(1, v1::SCALE_TEST_RUNNING);
      while (true) {
        ASSIGN_OR_RETURN(const bool row, list.Step());
        if (!row) break;
        ASSIGN_OR_RETURN(StoredScaleTest t, ReadRow(list, db.path()));
        out.push_back(std::move(t));
      }
      return absl::OkStatus();
    }));
    return out;
  }

 private:
  absl::Status Transaction(std::string_view begin,
                           absl::FunctionRef<absl::Status(SqliteConnection&)> body) {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(db_->Exec(begin));
    absl::Status status = body(*db_);
    if (status.ok()) status = db_->Exec("COMMIT");
    if (!status.ok()) (void)db_->Exec("ROLLBACK");  // harmless when COMMIT already ended it
    return status;
  }

  absl::Mutex mu_;
  const std::unique_ptr<SqliteConnection> db_ ABSL_PT_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<ScaleTestStore>> OpenSqliteScaleTestStore(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<SqliteConnection> db,
                   SqliteConnection::Open(path, /*create=*/false));
  absl::StatusOr<std::string> id = db->QueryText("PRAGMA application_id");
  if (!id.ok() || *id != std::to_string(kLoomApplicationId)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a Loom database",
                     id.ok() ? absl::StrCat(" (application_id ", *id, ")")
                             : absl::StrCat(" (", id.status().message(), ")"),
                     "; open it with the job store first (loomd does)"));
  }
  RETURN_IF_ERROR(db->Exec("PRAGMA synchronous = FULL"));
  RETURN_IF_ERROR(db->Exec("BEGIN IMMEDIATE"));
  absl::Status status = db->Exec(kSchema);
  if (status.ok()) status = db->Exec("COMMIT");
  if (!status.ok()) {
    (void)db->Exec("ROLLBACK");
    return status;
  }
  return std::unique_ptr<ScaleTestStore>(new SqliteScaleTestStore(std::move(db)));
}

}  // namespace loom::scaling
