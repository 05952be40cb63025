// GroupCommitter: concurrent writers of one SQLite connection share one transaction, and so one
// WAL sync, instead of taking one fsync'd transaction each. Internal to server/store/.
//
// Contract of Write(body, synced):
//  - `body` runs on the writer connection inside a transaction, alone (bodies never overlap),
//    in a SAVEPOINT of its own: when it fails, only its own changes are rolled back and the
//    other writes of the batch still commit.
//  - Write returns only after the transaction holding `body`'s changes has committed, or has
//    been rolled back. A synced write's batch commits under synchronous=FULL, so its OK return
//    means on disk, exactly as with one transaction per write. A batch of only unsynced writes
//    commits under NORMAL: committed and safe from a crash of the process, on disk with the
//    next synced commit or checkpoint. A failed return means nothing of `body` was written.
//    When the COMMIT itself fails every write of the batch fails with that error.
//  - Order: bodies run in the order their batch was taken, and batches commit one after the
//    other, so the order of effects (e.g. AUTOINCREMENT sequences) is the commit order.
//
// How: leader/follower. A writer queues its body; if no batch is in flight it becomes the
// leader, takes every queued body (its own included), runs them in one BEGIN IMMEDIATE …
// COMMIT, then marks them done and wakes their owners. Writers that arrive meanwhile queue up
// and form the next batch, so the batch size grows with the load by itself and a lone writer
// pays no waiting: it commits at once, as before.
//
// Thread-safe. The connection must be used only through this object once it is built.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/store/sqlite_connection.h"

namespace loom::store {

class GroupCommitter {
 public:
  explicit GroupCommitter(std::unique_ptr<SqliteConnection> writer) : writer_(std::move(writer)) {}
  GroupCommitter(const GroupCommitter&) = delete;
  GroupCommitter& operator=(const GroupCommitter&) = delete;

  // `synced` false: the transaction may commit under synchronous=NORMAL (no WAL sync; durable
  // against a crash of the process, and on disk with the next synced commit or checkpoint). A
  // batch holding any synced write commits synced, so a synced write never loses its sync.
  absl::Status Write(absl::FunctionRef<absl::Status(SqliteConnection&)> body, bool synced = true);

  // Counters since construction, for tests and benchmarks: writes is the number of Write calls
  // that ran a body, transactions the number of batches (BEGIN … COMMIT) that carried them.
  struct Stats {
    int64_t writes = 0;
    int64_t transactions = 0;
    int64_t largest_batch = 0;
  };
  Stats stats() const;

 private:
  struct Pending {
    Pending(absl::FunctionRef<absl::Status(SqliteConnection&)> b, bool sync)
        : body(b), synced(sync) {}
    absl::FunctionRef<absl::Status(SqliteConnection&)> body;
    bool synced;
    absl::Status status;
    bool done = false;
  };

  // Runs one batch on the writer; sets every entry's status. Called by the leader only, without
  // `mu_` held (the leader flag gives it the connection alone).
  void RunBatch(const std::vector<Pending*>& batch);

  const std::unique_ptr<SqliteConnection> writer_;  // used by the current leader only
  // The writer's synchronous level: FULL (as the store opens it) or NORMAL. Leader only.
  bool writer_full_ = true;
  mutable absl::Mutex mu_;
  std::vector<Pending*> queue_ ABSL_GUARDED_BY(mu_);
  bool leader_active_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar batch_done_;  // signalled when a batch ends
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom::store
