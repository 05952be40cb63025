// The SQLite CalibrationStore: two tables in loomd's database (loomd.db under --state-dir),
// beside the job store's.
//
// Schema, created with CREATE TABLE IF NOT EXISTS when the store opens, so that a database
// written before calibration existed gains the tables without a migration; the job store's
// schema version (PRAGMA user_version) is left alone, so the file stays readable by a loomd
// that predates calibration (SQLite ignores tables nobody queries):
//   calibration(device_model TEXT PRIMARY KEY, calibration BLOB = v1::PlanCalibration)
//   calibration_records(sequence INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT UNIQUE,
//                       device_model TEXT, time_unix_ms INTEGER,
//                       planned_with BLOB = v1::PlanCalibration, plan_check BLOB = v1::PlanCheck)
// Scales are stored inside the protobuf blobs so that doubles round-trip exactly.
//
// Durability and atomicity as the job store: WAL (already set on the file by the job store),
// synchronous=FULL on this connection, one BEGIN IMMEDIATE transaction per write.
//
// Threading: one connection behind a mutex; calibration writes happen once per finished job and
// reads once at start-up, so there is nothing to gain from a reader pool.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "server/calibration/calibration_store.h"
#include "server/calibration/store_checks.h"
#include "server/store/sqlite_connection.h"

namespace loom::calibration {
namespace {

using store::SqliteConnection;
using store::Statement;

// The job store's mark of a Loom database (server/store/sqlite_job_store.cc): "LOOM".
constexpr int64_t kLoomApplicationId = 0x4C4F4F4D;

constexpr std::string_view kSchema = R"sql(
CREATE TABLE IF NOT EXISTS calibration (
  device_model TEXT PRIMARY KEY,
  calibration  BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS calibration_records (
  sequence     INTEGER PRIMARY KEY AUTOINCREMENT,
  job          TEXT    NOT NULL UNIQUE,
  device_model TEXT    NOT NULL,
  time_unix_ms INTEGER NOT NULL,
  planned_with BLOB    NOT NULL,
  plan_check   BLOB    NOT NULL
);
CREATE INDEX IF NOT EXISTS calibration_records_by_model
  ON calibration_records(device_model, sequence);
)sql";

std::string S(std::string_view v) { return std::string(v); }

template <typename Message>
absl::StatusOr<Message> Parse(std::string_view bytes, const std::string& path) {
  Message message;
  if (!message.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(absl::StrCat("SQLite database ", path,
                                            ": a stored calibration does not parse as ",
                                            message.GetTypeName(), "; the file is damaged"));
  }
  return message;
}

class SqliteCalibrationStore final : public CalibrationStore {
 public:
  explicit SqliteCalibrationStore(std::unique_ptr<SqliteConnection> db) : db_(std::move(db)) {}

  absl::StatusOr<bool> Record(const CalibrationRecord& record,
                              const v1::PlanCalibration& updated) override {
    RETURN_IF_ERROR(CheckForRecord(record, updated));
    const std::string planned_with = record.planned_with.SerializeAsString();
    const std::string check = record.check.SerializeAsString();
    const std::string calibration = updated.SerializeAsString();
    bool inserted = false;
    RETURN_IF_ERROR(Transaction("BEGIN IMMEDIATE", [&](SqliteConnection& db) -> absl::Status {
      {
        ASSIGN_OR_RETURN(
            Statement insert,
            db.Prepare("INSERT INTO calibration_records (job, device_model, "
                       "time_unix_ms, planned_with, plan_check) VALUES (?, ?, ?, ?, ?) "
                       "ON CONFLICT (job) DO NOTHING RETURNING sequence"));
        insert.BindText(1, record.job);
        insert.BindText(2, updated.device_model());
        insert.BindInt(3, absl::ToUnixMillis(record.time));
        insert.BindBlob(4, planned_with);
        insert.BindBlob(5, check);
        ASSIGN_OR_RETURN(inserted, insert.Step());
        if (inserted) RETURN_IF_ERROR(insert.Step().status());  // finish the statement
      }
      if (!inserted) return absl::OkStatus();
      ASSIGN_OR_RETURN(Statement put, db.Prepare("INSERT INTO calibration (device_model, "
                                                 "calibration) VALUES (?, ?) ON CONFLICT "
                                                 "(device_model) DO UPDATE SET calibration = "
                                                 "excluded.calibration"));
      put.BindText(1, updated.device_model());
      put.BindBlob(2, calibration);
      return put.Step().status();
    }));
    return inserted;
  }

  absl::StatusOr<std::vector<v1::PlanCalibration>> ListCalibrations() override {
    std::vector<v1::PlanCalibration> out;
    RETURN_IF_ERROR(Transaction("BEGIN", [&](SqliteConnection& db) -> absl::Status {
      ASSIGN_OR_RETURN(Statement list, db.Prepare("SELECT device_model, calibration FROM "
                                                  "calibration ORDER BY device_model"));
      while (true) {
        ASSIGN_OR_RETURN(const bool row, list.Step());
        if (!row) break;
        ASSIGN_OR_RETURN(v1::PlanCalibration c,
                         Parse<v1::PlanCalibration>(list.ColumnBytes(1), db.path()));
        c.set_device_model(S(list.ColumnBytes(0)));  // the key is authoritative
        out.push_back(std::move(c));
      }
      return absl::OkStatus();
    }));
    return out;
  }

  absl::StatusOr<std::vector<CalibrationRecord>> ListRecords(
      std::string_view device_model) override {
    std::vector<CalibrationRecord> out;
    RETURN_IF_ERROR(Transaction("BEGIN", [&](SqliteConnection& db) -> absl::Status {
      ASSIGN_OR_RETURN(Statement list,
                       db.Prepare("SELECT job, time_unix_ms, planned_with, plan_check FROM "
                                  "calibration_records WHERE device_model = ? ORDER BY sequence"));
      list.BindText(1, device_model);
      while (true) {
        ASSIGN_OR_RETURN(const bool row, list.Step());
        if (!row) break;
        CalibrationRecord r;
        r.job = S(list.ColumnBytes(0));
        r.time = absl::FromUnixMillis(list.ColumnInt(1));
        ASSIGN_OR_RETURN(r.planned_with,
                         Parse<v1::PlanCalibration>(list.ColumnBytes(2), db.path()));
        ASSIGN_OR_RETURN(r.check, Parse<v1::PlanCheck>(list.ColumnBytes(3), db.path()));
        out.push_back(std::move(r));
      }
      return absl::OkStatus();
    }));
    return out;
  }

 private:
  // Runs `body` in one transaction begun with `begin`; commits when it returns OK, rolls back
  // otherwise.
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

absl::StatusOr<std::unique_ptr<CalibrationStore>> OpenSqliteCalibrationStore(
    const std::string& path) {
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
  return std::unique_ptr<CalibrationStore>(new SqliteCalibrationStore(std::move(db)));
}

}  // namespace loom::calibration
