// SqliteJobStore: the production JobStore, one SQLite file under loomd's --state-dir.
//
// Durability: WAL journal with synchronous=FULL. In WAL mode NORMAL already survives a crash
// of loomd (kill -9) but may lose the last commits on power loss; FULL syncs the WAL at every
// commit so that a job acknowledged to a client (CreateJob returned) survives power loss too.
// A Durability::kDeferred update commits under NORMAL (group_commit.h): the next FULL commit's
// sync, or a checkpoint, takes it to the disk with it.
//
// Group commit (group_commit.h): concurrent write calls share one BEGIN IMMEDIATE … COMMIT and
// so one WAL sync; each call still returns only after that commit, so an acknowledged write is
// as durable as before, and a burst of N creates costs one fsync instead of N.
//
// Atomicity: every write method runs in its own savepoint of the shared transaction; any error
// rolls back that savepoint (or the whole batch when the COMMIT fails), so a failed call
// writes nothing.
//
// Threading: one writer connection owned by the GroupCommitter (SQLite allows one writer at a
// time anyway, and one writer makes sequence order = commit order, which is what keeps
// ListJobs paging stable under concurrent inserts); reads use a pool of reader connections
// and run concurrently with the writer, each multi-statement read in its own read transaction
// (one WAL snapshot).
//
// Schema (PRAGMA user_version = kSchemaVersion; PRAGMA application_id = kApplicationId marks
// the file as Loom's, so a foreign SQLite file is refused instead of being written into):
//   jobs(sequence INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT UNIQUE, request_id TEXT (NULL
//        when absent; unique among non-NULL), state INTEGER, job BLOB = v1::Job without events)
//   events(job → jobs.sequence, sequence 1, 2, 3 … per job, event BLOB = v1::JobEvent)
//   nodes(name TEXT PRIMARY KEY, node BLOB = v1::Node)
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "server/store/group_commit.h"
#include "server/store/job_store.h"
#include "server/store/sqlite_connection.h"
#include "server/store/store_checks.h"

namespace loom::store {
namespace {

constexpr int kSchemaVersion = 1;
constexpr int64_t kApplicationId = 0x4C4F4F4D;  // "LOOM"
// Idle reader connections kept open; more are opened under load and closed when returned.
constexpr size_t kMaxIdleReaders = 8;

constexpr std::string_view kSchema = R"sql(
CREATE TABLE jobs (
  sequence   INTEGER PRIMARY KEY AUTOINCREMENT,
  name       TEXT    NOT NULL UNIQUE,
  request_id TEXT,
  state      INTEGER NOT NULL,
  job        BLOB    NOT NULL
);
CREATE UNIQUE INDEX jobs_by_request_id ON jobs(request_id) WHERE request_id IS NOT NULL;
CREATE INDEX jobs_by_state ON jobs(state, sequence);
CREATE TABLE events (
  job      INTEGER NOT NULL REFERENCES jobs(sequence),
  sequence INTEGER NOT NULL,
  event    BLOB    NOT NULL,
  PRIMARY KEY (job, sequence)
) WITHOUT ROWID;
CREATE TABLE nodes (
  name TEXT PRIMARY KEY,
  node BLOB NOT NULL
) WITHOUT ROWID;
)sql";

std::string S(std::string_view v) { return std::string(v); }

// Parses a stored blob; a blob that does not parse means the file was damaged or written by
// something else, which is DATA_LOSS (never a crash).
template <typename Message>
absl::StatusOr<Message> ParseBlob(std::string_view bytes, std::string_view what,
                                  const std::string& path) {
  Message message;
  if (!message.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(absl::StrCat("SQLite database ", path, ": the stored ", S(what),
                                            " does not parse as ", message.GetTypeName(),
                                            "; the file is damaged (restore it from a backup)"));
  }
  return message;
}

absl::StatusOr<std::string> Serialize(const google::protobuf::Message& message) {
  std::string bytes;
  if (!message.SerializeToString(&bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot serialize ", message.GetTypeName(), " (over 2 GiB?)"));
  }
  return bytes;
}

class SqliteJobStore final : public JobStore {
 public:
  SqliteJobStore(std::string path, std::unique_ptr<SqliteConnection> writer)
      : path_(std::move(path)), writer_(std::move(writer)) {}

  absl::StatusOr<int64_t> CreateJob(const v1::Job& job, const v1::JobEvent& first_event) override {
    RETURN_IF_ERROR(CheckJobForWrite(job));
    ASSIGN_OR_RETURN(const std::string job_bytes, Serialize(StripEvents(job)));
    v1::JobEvent event = first_event;
    event.set_sequence(1);
    ASSIGN_OR_RETURN(const std::string event_bytes, Serialize(event));
    int64_t sequence = 0;
    RETURN_IF_ERROR(Write([&](SqliteConnection& db) -> absl::Status {
      {
        ASSIGN_OR_RETURN(Statement find, db.Prepare("SELECT 1 FROM jobs WHERE name = ?"));
        find.BindText(1, job.name());
        ASSIGN_OR_RETURN(const bool found, find.Step());
        if (found) {
          return absl::AlreadyExistsError(absl::StrCat("job ", job.name(), " already exists"));
        }
      }
      if (!job.request_id().empty()) {
        ASSIGN_OR_RETURN(Statement find, db.Prepare("SELECT name FROM jobs WHERE request_id = ?"));
        find.BindText(1, RequestKey(job));
        ASSIGN_OR_RETURN(const bool found, find.Step());
        if (found) {
          return absl::AlreadyExistsError(absl::StrCat("request_id \"", job.request_id(),
                                                       "\" was already used to create job ",
                                                       S(find.ColumnBytes(0))));
        }
      }
      {
        ASSIGN_OR_RETURN(Statement insert,
                         db.Prepare("INSERT INTO jobs (name, request_id, state, job) "
                                    "VALUES (?, ?, ?, ?) RETURNING sequence"));
        insert.BindText(1, job.name());
        const std::string request_key = job.request_id().empty() ? "" : RequestKey(job);
        insert.BindTextOrNull(2, request_key);
        insert.BindInt(3, job.state());
        insert.BindBlob(4, job_bytes);
        ASSIGN_OR_RETURN(const bool row, insert.Step());
        if (!row) return absl::InternalError("INSERT … RETURNING gave no row");
        sequence = insert.ColumnInt(0);
        ASSIGN_OR_RETURN(const bool more, insert.Step());  // finish the statement
        (void)more;
      }
      return InsertEvent(db, sequence, 1, event_bytes);
    }));
    return sequence;
  }

  absl::StatusOr<StoredJob> GetJob(std::string_view name) override {
    ASSIGN_OR_RETURN(std::optional<StoredJob> job,
                     FindOne("SELECT sequence, job FROM jobs WHERE name = ?", name));
    if (!job.has_value()) return NotFound(name);
    return *std::move(job);
  }

  absl::StatusOr<std::optional<StoredJob>> FindJobByRequestId(
      std::string_view request_id) override {
    if (request_id.empty()) return std::optional<StoredJob>();
    return FindOne("SELECT sequence, job FROM jobs WHERE request_id = ?", request_id);
  }

  absl::StatusOr<JobPage> ListJobs(std::optional<v1::JobState> state, int64_t after_sequence,
                                   int limit) override {
    RETURN_IF_ERROR(CheckListLimit(limit));
    JobPage page;
    RETURN_IF_ERROR(Read([&](SqliteConnection& db) -> absl::Status {
      // One row more than asked tells whether another page follows.
      ASSIGN_OR_RETURN(
          Statement list,
          db.Prepare(state.has_value()
                         ? "SELECT sequence, job FROM jobs WHERE state = ?3 AND sequence > ?1 "
                           "ORDER BY sequence LIMIT ?2"
                         : "SELECT sequence, job FROM jobs WHERE sequence > ?1 "
                           "ORDER BY sequence LIMIT ?2"));
      list.BindInt(1, after_sequence);
      list.BindInt(2, static_cast<int64_t>(limit) + 1);
      if (state.has_value()) list.BindInt(3, *state);
      while (true) {
        ASSIGN_OR_RETURN(const bool row, list.Step());
        if (!row) break;
        if (static_cast<int>(page.jobs.size()) == limit) {
          page.has_more = true;
          break;
        }
        ASSIGN_OR_RETURN(StoredJob job, ReadStoredJob(list));
        page.jobs.push_back(std::move(job));
      }
      return absl::OkStatus();
    }));
    return page;
  }

  using JobStore::UpdateJob;
  absl::Status UpdateJob(const v1::Job& job, const std::optional<v1::JobEvent>& event,
                         Durability durability) override {
    RETURN_IF_ERROR(CheckJobForWrite(job));
    return Write(durability, [&](SqliteConnection& db) -> absl::Status {
      int64_t sequence = 0;
      std::string request_id;
      {
        ASSIGN_OR_RETURN(Statement find,
                         db.Prepare("SELECT sequence, request_id FROM jobs WHERE name = ?"));
        find.BindText(1, job.name());
        ASSIGN_OR_RETURN(const bool found, find.Step());
        if (!found) return NotFound(job.name());
        sequence = find.ColumnInt(0);
        request_id = S(find.ColumnBytes(1));
      }
      v1::Job stored = StripEvents(job);
      // The idempotency key is fixed at creation (it is indexed); an update cannot move it. The
      // column holds it scoped by tenant (RequestKey); the job holds it as the user gave it.
      const std::string scope = RequestKey(stored.tenant(), "");
      if (!scope.empty() && request_id.compare(0, scope.size(), scope) == 0) {
        request_id.erase(0, scope.size());
      }
      stored.set_request_id(request_id);
      ASSIGN_OR_RETURN(const std::string job_bytes, Serialize(stored));
      {
        ASSIGN_OR_RETURN(Statement update,
                         db.Prepare("UPDATE jobs SET state = ?, job = ? WHERE sequence = ?"));
        update.BindInt(1, stored.state());
        update.BindBlob(2, job_bytes);
        update.BindInt(3, sequence);
        RETURN_IF_ERROR(update.Step().status());
      }
      if (!event.has_value()) return absl::OkStatus();
      int64_t next = 0;
      {
        ASSIGN_OR_RETURN(
            Statement last,
            db.Prepare("SELECT COALESCE(MAX(sequence), 0) + 1 FROM events WHERE job = ?"));
        last.BindInt(1, sequence);
        RETURN_IF_ERROR(last.Step().status());
        next = last.ColumnInt(0);
      }
      v1::JobEvent appended = *event;
      appended.set_sequence(next);
      ASSIGN_OR_RETURN(const std::string event_bytes, Serialize(appended));
      return InsertEvent(db, sequence, next, event_bytes);
    });
  }

  absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(std::string_view name) override {
    std::vector<v1::JobEvent> events;
    RETURN_IF_ERROR(Read([&](SqliteConnection& db) -> absl::Status {
      int64_t sequence = 0;
      {
        ASSIGN_OR_RETURN(Statement find, db.Prepare("SELECT sequence FROM jobs WHERE name = ?"));
        find.BindText(1, name);
        ASSIGN_OR_RETURN(const bool found, find.Step());
        if (!found) return NotFound(name);
        sequence = find.ColumnInt(0);
      }
      ASSIGN_OR_RETURN(
          Statement list,
          db.Prepare("SELECT sequence, event FROM events WHERE job = ? ORDER BY sequence"));
      list.BindInt(1, sequence);
      while (true) {
        ASSIGN_OR_RETURN(const bool row, list.Step());
        if (!row) break;
        ASSIGN_OR_RETURN(v1::JobEvent event,
                         ParseBlob<v1::JobEvent>(list.ColumnBytes(1), "event", path_));
        event.set_sequence(list.ColumnInt(0));  // the column is authoritative
        events.push_back(std::move(event));
      }
      return absl::OkStatus();
    }));
    return events;
  }

  absl::StatusOr<std::vector<StoredJob>> ListActiveJobs() override {
    std::vector<StoredJob> jobs;
    RETURN_IF_ERROR(Read([&](SqliteConnection& db) -> absl::Status {
      ASSIGN_OR_RETURN(Statement list,
                       db.Prepare("SELECT sequence, job FROM jobs WHERE state IN (?, ?, ?, ?) "
                                  "ORDER BY sequence"));
      list.BindInt(1, v1::QUEUED);
      list.BindInt(2, v1::SCHEDULED);
      list.BindInt(3, v1::RUNNING);
      list.BindInt(4, v1::RESTARTING);
      while (true) {
        ASSIGN_OR_RETURN(const bool row, list.Step());
        if (!row) break;
        ASSIGN_OR_RETURN(StoredJob job, ReadStoredJob(list));
        jobs.push_back(std::move(job));
      }
      return absl::OkStatus();
    }));
    return jobs;
  }

  absl::Status PutNode(const v1::Node& node) override {
    RETURN_IF_ERROR(CheckNodeForWrite(node));
    ASSIGN_OR_RETURN(const std::string bytes, Serialize(node));
    return Write([&](SqliteConnection& db) -> absl::Status {
      ASSIGN_OR_RETURN(Statement put,
                       db.Prepare("INSERT INTO nodes (name, node) VALUES (?, ?) "
                                  "ON CONFLICT (name) DO UPDATE SET node = excluded.node"));
      put.BindText(1, node.name());
      put.BindBlob(2, bytes);
      return put.Step().status();
    });
  }

  absl::StatusOr<std::vector<v1::Node>> ListNodes() override {
    std::vector<v1::Node> nodes;
    RETURN_IF_ERROR(Read([&](SqliteConnection& db) -> absl::Status {
      ASSIGN_OR_RETURN(Statement list, db.Prepare("SELECT node FROM nodes ORDER BY name"));
      while (true) {
        ASSIGN_OR_RETURN(const bool row, list.Step());
        if (!row) break;
        ASSIGN_OR_RETURN(v1::Node node, ParseBlob<v1::Node>(list.ColumnBytes(0), "node", path_));
        nodes.push_back(std::move(node));
      }
      return absl::OkStatus();
    }));
    return nodes;
  }

  absl::Status DeleteNode(std::string_view name) override {
    return Write([&](SqliteConnection& db) -> absl::Status {
      ASSIGN_OR_RETURN(Statement del,
                       db.Prepare("DELETE FROM nodes WHERE name = ? RETURNING name"));
      del.BindText(1, name);
      ASSIGN_OR_RETURN(const bool row, del.Step());
      if (!row) return absl::NotFoundError(absl::StrCat("node ", S(name), " not found"));
      ASSIGN_OR_RETURN(const bool more, del.Step());  // finish the statement
      (void)more;
      return absl::OkStatus();
    });
  }

 private:
  static absl::Status NotFound(std::string_view name) {
    return absl::NotFoundError(absl::StrCat("job ", S(name), " not found"));
  }

  // Runs `body` on the writer connection in a (possibly shared) write transaction; returns once
  // that transaction committed (OK) or `body`'s changes were rolled back (its error).
  absl::Status Write(absl::FunctionRef<absl::Status(SqliteConnection&)> body) {
    return writer_.Write(body);
  }
  absl::Status Write(Durability durability,
                     absl::FunctionRef<absl::Status(SqliteConnection&)> body) {
    return writer_.Write(body, durability == Durability::kSynced);
  }

  // Runs `body` in one read transaction (one consistent snapshot) on a pooled reader.
  absl::Status Read(absl::FunctionRef<absl::Status(SqliteConnection&)> body) {
    ASSIGN_OR_RETURN(std::unique_ptr<SqliteConnection> reader, AcquireReader());
    absl::Status status = reader->Exec("BEGIN");
    if (status.ok()) {
      status = body(*reader);
      // A read transaction has nothing to commit; COMMIT just releases the snapshot.
      const absl::Status end = reader->Exec(status.ok() ? "COMMIT" : "ROLLBACK");
      if (status.ok()) status = end;
    }
    ReleaseReader(std::move(reader));
    return status;
  }

  absl::StatusOr<std::unique_ptr<SqliteConnection>> AcquireReader() {
    {
      absl::MutexLock lock(&pool_mu_);
      if (!idle_readers_.empty()) {
        std::unique_ptr<SqliteConnection> reader = std::move(idle_readers_.back());
        idle_readers_.pop_back();
        return reader;
      }
    }
    ASSIGN_OR_RETURN(std::unique_ptr<SqliteConnection> reader,
                     SqliteConnection::Open(path_, /*create=*/false));
    RETURN_IF_ERROR(reader->Exec("PRAGMA foreign_keys = ON"));
    return reader;
  }

  void ReleaseReader(std::unique_ptr<SqliteConnection> reader) {
    absl::MutexLock lock(&pool_mu_);
    if (idle_readers_.size() < kMaxIdleReaders) idle_readers_.push_back(std::move(reader));
  }

  absl::StatusOr<std::optional<StoredJob>> FindOne(std::string_view sql, std::string_view key) {
    std::optional<StoredJob> result;
    RETURN_IF_ERROR(Read([&](SqliteConnection& db) -> absl::Status {
      ASSIGN_OR_RETURN(Statement find, db.Prepare(sql));
      find.BindText(1, key);
      ASSIGN_OR_RETURN(const bool found, find.Step());
      if (!found) return absl::OkStatus();
      ASSIGN_OR_RETURN(StoredJob job, ReadStoredJob(find));
      result = std::move(job);
      return absl::OkStatus();
    }));
    return result;
  }

  // Columns (sequence, job) of the current row.
  absl::StatusOr<StoredJob> ReadStoredJob(const Statement& row) const {
    ASSIGN_OR_RETURN(v1::Job job, ParseBlob<v1::Job>(row.ColumnBytes(1), "job", path_));
    return StoredJob{row.ColumnInt(0), std::move(job)};
  }

  static absl::Status InsertEvent(SqliteConnection& db, int64_t job_sequence,
                                  int64_t event_sequence, const std::string& bytes) {
    ASSIGN_OR_RETURN(Statement insert,
                     db.Prepare("INSERT INTO events (job, sequence, event) VALUES (?, ?, ?)"));
    insert.BindInt(1, job_sequence);
    insert.BindInt(2, event_sequence);
    insert.BindBlob(3, bytes);
    return insert.Step().status();
  }

  const std::string path_;
  GroupCommitter writer_;
  absl::Mutex pool_mu_;
  std::vector<std::unique_ptr<SqliteConnection>> idle_readers_ ABSL_GUARDED_BY(pool_mu_);
};

absl::Status NotLoom(const std::string& path, std::string_view why) {
  return absl::FailedPreconditionError(absl::StrCat(
      path, " is not a Loom database (", S(why),
      "); point loomd's --state-dir at an empty directory or at one written by loomd"));
}

// Reads the file's identity, creating the schema in an empty database. Runs before WAL mode is
// switched on, so that a foreign file is refused before anything is written to it.
absl::Status CheckOrCreateSchema(SqliteConnection& db) {
  const std::string& path = db.path();
  // The first read of the file: garbage shows up here as NOTADB (or CORRUPT).
  absl::StatusOr<std::string> app_id = db.QueryText("PRAGMA application_id");
  if (absl::IsDataLoss(app_id.status()))
    return NotLoom(path, std::string(app_id.status().message()));
  if (!app_id.ok()) return app_id.status();

  RETURN_IF_ERROR(db.Exec("BEGIN IMMEDIATE"));
  auto check = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const std::string id, db.QueryText("PRAGMA application_id"));
    ASSIGN_OR_RETURN(const std::string version, db.QueryText("PRAGMA user_version"));
    ASSIGN_OR_RETURN(const std::string objects, db.QueryText("SELECT count(*) FROM sqlite_master"));
    if (id == std::to_string(kApplicationId)) {
      if (version == std::to_string(kSchemaVersion)) return absl::OkStatus();
      return absl::FailedPreconditionError(absl::StrCat(
          "Loom database ", path, " has schema version ", version, " but this loomd reads version ",
          kSchemaVersion, "; run the loomd release that wrote it, or start on a new --state-dir"));
    }
    if (id != "0" || version != "0" || objects != "0") {
      return NotLoom(path, absl::StrCat("application_id ", id, ", user_version ", version, ", ",
                                        objects, " schema objects"));
    }
    RETURN_IF_ERROR(db.Exec(kSchema));
    RETURN_IF_ERROR(db.Exec(absl::StrCat("PRAGMA application_id = ", kApplicationId)));
    return db.Exec(absl::StrCat("PRAGMA user_version = ", kSchemaVersion));
  };
  absl::Status status = check();
  if (status.ok()) status = db.Exec("COMMIT");
  if (!status.ok()) (void)db.Exec("ROLLBACK");
  return status;
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteJobStore(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<SqliteConnection> writer,
                   SqliteConnection::Open(path, /*create=*/true));
  RETURN_IF_ERROR(CheckOrCreateSchema(*writer));
  // journal_mode is persistent in the file; the reply is the mode now in force.
  ASSIGN_OR_RETURN(const std::string mode, writer->QueryText("PRAGMA journal_mode = WAL"));
  if (mode != "wal") {
    return absl::FailedPreconditionError(
        absl::StrCat("SQLite database ", path, ": cannot switch to WAL mode (journal_mode is ",
                     mode, "); put --state-dir on a local filesystem"));
  }
  RETURN_IF_ERROR(writer->Exec("PRAGMA synchronous = FULL"));
  RETURN_IF_ERROR(writer->Exec("PRAGMA foreign_keys = ON"));
  return std::unique_ptr<JobStore>(new SqliteJobStore(path, std::move(writer)));
}

}  // namespace loom::store
