// SqliteConnection: one sqlite3 handle with its cache of prepared statements, and Statement,
// the RAII view of one cached statement. Internal to server/store/.
//
// Threading: a connection is used by one thread at a time (the owner serialises access; the
// handle is opened SQLITE_OPEN_NOMUTEX). A Statement must not outlive its connection's use.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::store {

// Maps a SQLite result code to a canonical status whose message names `what` and `path`:
// BUSY/LOCKED → UNAVAILABLE (retry later), CORRUPT/NOTADB → DATA_LOSS, FULL → RESOURCE_EXHAUSTED,
// CANTOPEN/READONLY/PERM → FAILED_PRECONDITION, anything else → INTERNAL.
absl::Status SqliteStatus(int rc, std::string_view detail, std::string_view what,
                          std::string_view path);

// A cached prepared statement for one use: bind, step, read columns. The destructor resets it
// and clears its bindings so the next user starts clean.
class Statement {
 public:
  Statement(sqlite3_stmt* stmt, sqlite3* db, const std::string* path)
      : stmt_(stmt), db_(db), path_(path) {}
  ~Statement();
  Statement(Statement&& other) noexcept
      : stmt_(other.stmt_), db_(other.db_), path_(other.path_), bind_rc_(other.bind_rc_) {
    other.stmt_ = nullptr;
  }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  Statement& operator=(Statement&&) = delete;

  // Parameters are 1-based, as in SQLite. A failed bind is reported by the next Step().
  void BindInt(int index, int64_t value);
  void BindText(int index, std::string_view value);
  void BindTextOrNull(int index, std::string_view value);  // empty → NULL
  void BindBlob(int index, std::string_view bytes);

  // true: a row is ready; false: done. Errors name the statement's SQL.
  absl::StatusOr<bool> Step();

  int64_t ColumnInt(int index) const;
  // Valid until the next Step() or the end of this Statement.
  std::string_view ColumnBytes(int index) const;
  bool ColumnIsNull(int index) const;

 private:
  void NoteBind(int rc);

  sqlite3_stmt* stmt_;
  sqlite3* db_;
  const std::string* path_;
  int bind_rc_ = SQLITE_OK;
};

class SqliteConnection {
 public:
  // Opens `path` (creating the file when `create`) with the busy timeout set. Does not read the
  // file: a garbage file is noticed by the first statement.
  static absl::StatusOr<std::unique_ptr<SqliteConnection>> Open(const std::string& path,
                                                                bool create);
  ~SqliteConnection();
  SqliteConnection(const SqliteConnection&) = delete;
  SqliteConnection& operator=(const SqliteConnection&) = delete;

  // `sql` is compiled once per connection and reused (key: the SQL text).
  absl::StatusOr<Statement> Prepare(std::string_view sql);

  // Runs statements that return no rows we need (BEGIN, COMMIT, PRAGMA x=y, DDL).
  absl::Status Exec(std::string_view sql);

  // Runs `sql` (a query of one integer or text column) and returns the first row's value as text.
  absl::StatusOr<std::string> QueryText(std::string_view sql);

  const std::string& path() const { return path_; }

 private:
  SqliteConnection(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}

  sqlite3* db_;
  std::string path_;
  std::map<std::string, sqlite3_stmt*, std::less<>> statements_;
};

}  // namespace loom::store
