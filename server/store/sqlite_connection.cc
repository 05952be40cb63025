#include "server/store/sqlite_connection.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace loom::store {
namespace {

// How long a statement waits for another connection's write lock (another thread's reader
// checkpointing, or a second process on the same file) before giving up with UNAVAILABLE.
constexpr int kBusyTimeoutMs = 5000;

// This Abseil's StrCat takes absl::string_view, which is not std::string_view.
std::string S(std::string_view v) { return std::string(v); }

}  // namespace

absl::Status SqliteStatus(int rc, std::string_view detail, std::string_view what,
                          std::string_view path) {
  const std::string message =
      absl::StrCat("SQLite database ", S(path), ": ", S(what), ": ", S(detail));
  switch (rc & 0xff) {  // the primary code, without extended bits
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(
          absl::StrCat(message, " (the database is locked by another writer; retry)"));
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(message);
    case SQLITE_FULL:
      return absl::ResourceExhaustedError(
          absl::StrCat(message, " (the disk is full; free space under the state dir)"));
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
    case SQLITE_PERM:
      return absl::FailedPreconditionError(
          absl::StrCat(message, " (check that the directory exists and is writable by loomd)"));
    default:
      return absl::InternalError(message);
  }
}

Statement::~Statement() {
  if (stmt_ == nullptr) return;
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

void Statement::NoteBind(int rc) {
  if (rc != SQLITE_OK && bind_rc_ == SQLITE_OK) bind_rc_ = rc;
}

void Statement::BindInt(int index, int64_t value) {
  NoteBind(sqlite3_bind_int64(stmt_, index, value));
}

void Statement::BindText(int index, std::string_view value) {
  NoteBind(
      sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
}

void Statement::BindTextOrNull(int index, std::string_view value) {
  if (value.empty()) {
    NoteBind(sqlite3_bind_null(stmt_, index));
  } else {
    BindText(index, value);
  }
}

void Statement::BindBlob(int index, std::string_view bytes) {
  // A zero-length blob must still be a blob, not NULL: sqlite3_bind_blob64 with a null pointer
  // binds NULL, so point at a static byte instead.
  static const char kEmpty = 0;
  NoteBind(sqlite3_bind_blob64(stmt_, index, bytes.empty() ? &kEmpty : bytes.data(), bytes.size(),
                               SQLITE_TRANSIENT));
}

absl::StatusOr<bool> Statement::Step() {
  if (bind_rc_ != SQLITE_OK) {
    return SqliteStatus(bind_rc_, sqlite3_errstr(bind_rc_),
                        absl::StrCat("binding ", sqlite3_sql(stmt_)), *path_);
  }
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return SqliteStatus(rc, sqlite3_errmsg(db_), sqlite3_sql(stmt_), *path_);
}

int64_t Statement::ColumnInt(int index) const { return sqlite3_column_int64(stmt_, index); }

std::string_view Statement::ColumnBytes(int index) const {
  const void* data = sqlite3_column_blob(stmt_, index);
  const int size = sqlite3_column_bytes(stmt_, index);  // after column_blob, as documented
  if (data == nullptr || size <= 0) return {};
  return std::string_view(static_cast<const char*>(data), static_cast<size_t>(size));
}

bool Statement::ColumnIsNull(int index) const {
  return sqlite3_column_type(stmt_, index) == SQLITE_NULL;
}

absl::StatusOr<std::unique_ptr<SqliteConnection>> SqliteConnection::Open(const std::string& path,
                                                                         bool create) {
  sqlite3* db = nullptr;
  const int flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_NOMUTEX;
  const int rc = sqlite3_open_v2(path.c_str(), &db, flags, nullptr);
  if (rc != SQLITE_OK) {
    const std::string detail = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close_v2(db);  // a handle is returned even on failure (or null: harmless)
    return SqliteStatus(rc, detail, "cannot open", path);
  }
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, kBusyTimeoutMs);
  return std::unique_ptr<SqliteConnection>(new SqliteConnection(db, path));
}

SqliteConnection::~SqliteConnection() {
  for (auto& [sql, stmt] : statements_) sqlite3_finalize(stmt);
  sqlite3_close_v2(db_);
}

absl::StatusOr<Statement> SqliteConnection::Prepare(std::string_view sql) {
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    sqlite3_stmt* stmt = nullptr;
    const int rc = sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()),
                                      SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
    if (rc != SQLITE_OK) {
      return SqliteStatus(rc, sqlite3_errmsg(db_), absl::StrCat("preparing ", S(sql)), path_);
    }
    it = statements_.emplace(std::string(sql), stmt).first;
  }
  return Statement(it->second, db_, &path_);
}

absl::Status SqliteConnection::Exec(std::string_view sql) {
  const std::string text(sql);
  char* error = nullptr;
  const int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &error);
  if (rc == SQLITE_OK) return absl::OkStatus();
  const std::string detail = error != nullptr ? error : sqlite3_errstr(rc);
  sqlite3_free(error);
  return SqliteStatus(rc, detail, text, path_);
}

absl::StatusOr<std::string> SqliteConnection::QueryText(std::string_view sql) {
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(stmt);
    return SqliteStatus(rc, sqlite3_errmsg(db_), sql, path_);
  }
  rc = sqlite3_step(stmt);
  std::string value;
  if (rc == SQLITE_ROW) {
    const unsigned char* text = sqlite3_column_text(stmt, 0);
    if (text != nullptr) value = reinterpret_cast<const char*>(text);
    rc = SQLITE_OK;
  } else if (rc == SQLITE_DONE) {
    rc = SQLITE_OK;
  }
  absl::Status status =
      rc == SQLITE_OK ? absl::OkStatus() : SqliteStatus(rc, sqlite3_errmsg(db_), sql, path_);
  sqlite3_finalize(stmt);
  if (!status.ok()) return status;
  return value;
}

}  // namespace loom::store
