#include "server/store/state_dir_guard.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace loom::store {
namespace {

std::string ErrnoText(int e) { return absl::StrCat(std::strerror(e), " (errno ", e, ")"); }

// What the database file holds, read without writing to it.
enum class DbContent { kMissing, kEmptyFile, kNoSchema, kNoJobs, kJobs, kUnreadable };

// Runs a one-value query; nullopt when it fails.
std::optional<int64_t> QueryInt(sqlite3* db, const char* sql) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr) != SQLITE_OK) {
    sqlite3_finalize(stmt);
    return std::nullopt;
  }
  std::optional<int64_t> value;
  if (sqlite3_step(stmt) == SQLITE_ROW) value = sqlite3_column_int64(stmt, 0);
  sqlite3_finalize(stmt);
  return value;
}

DbContent Inspect(const std::string& db_path) {
  struct stat st {};
  if (::stat(db_path.c_str(), &st) != 0) {
    return errno == ENOENT ? DbContent::kMissing : DbContent::kUnreadable;
  }
  if (st.st_size == 0) return DbContent::kEmptyFile;
  sqlite3* db = nullptr;
  // Read-only: a foreign or damaged file is left to the store's checks, untouched.
  if (sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return DbContent::kUnreadable;
  }
  DbContent content = DbContent::kUnreadable;
  const std::optional<int64_t> objects = QueryInt(db, "SELECT count(*) FROM sqlite_master");
  if (objects.has_value()) {
    if (*objects == 0) {
      content = DbContent::kNoSchema;
    } else if (std::optional<int64_t> jobs = QueryInt(db, "SELECT count(*) FROM jobs");
               jobs.has_value()) {
      content = *jobs == 0 ? DbContent::kNoJobs : DbContent::kJobs;
    }
  }
  sqlite3_close(db);
  return content;
}

// The evidence that the directory held jobs, or empty.
std::string HistoryOf(const std::string& state_dir) {
  std::error_code ec;
  const std::filesystem::path dir(state_dir);
  if (std::filesystem::exists(dir / kHeldJobsMarker, ec)) {
    return absl::StrCat("the marker ", kHeldJobsMarker, " says it held jobs");
  }
  const std::filesystem::path logs = dir / "logs";
  if (std::filesystem::is_directory(logs, ec) && !std::filesystem::is_empty(logs, ec) && !ec) {
    return "logs/ holds the logs of earlier jobs";
  }
  return "";
}

std::string Describe(DbContent content) {
  switch (content) {
    case DbContent::kMissing:
      return "is missing";
    case DbContent::kEmptyFile:
      return "is empty (0 bytes)";
    case DbContent::kNoSchema:
      return "has no schema";
    case DbContent::kNoJobs:
      return "holds no job";
    default:
      return "";
  }
}

}  // namespace

absl::StatusOr<StateDirVerdict> CheckStateDir(const std::string& state_dir,
                                              const std::string& db_path, bool start_fresh) {
  StateDirVerdict verdict;
  const DbContent content = Inspect(db_path);
  if (content == DbContent::kJobs || content == DbContent::kUnreadable) return verdict;
  const std::string history = HistoryOf(state_dir);
  if (history.empty()) return verdict;
  verdict.finding = absl::StrCat("the database ", db_path, " ", Describe(content), " but ",
                                 state_dir, " held jobs before (", history, ")");
  if (!start_fresh) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to start: ", verdict.finding,
        "; starting would forget every job and stop the running ones. Restore loomd.db from a "
        "backup, or pass --start-fresh to start with an empty database (running gangs that "
        "workers report are then quarantined, not killed)"));
  }
  verdict.fresh_over_history = true;
  return verdict;
}

absl::Status MarkStateDirHeldJobs(const std::string& state_dir) {
  const std::string path = absl::StrCat(state_dir, "/", kHeldJobsMarker);
  if (::access(path.c_str(), F_OK) == 0) return absl::OkStatus();
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", ErrnoText(errno)));
  }
  static constexpr char kText[] =
      "loomd stored jobs in this directory; it refuses to start on a lost loomd.db here\n";
  const bool written = ::write(fd, kText, sizeof(kText) - 1) == sizeof(kText) - 1;
  const int write_errno = errno;
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!written || !synced) {
    return absl::InternalError(
        absl::StrCat("cannot write ", tmp, ": ", ErrnoText(written ? errno : write_errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", ErrnoText(errno)));
  }
  const int dir = ::open(state_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  return absl::OkStatus();
}

}  // namespace loom::store
