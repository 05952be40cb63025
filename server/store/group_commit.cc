#include "server/store/group_commit.h"

#include <algorithm>
#include <utility>

namespace loom::store {

absl::Status GroupCommitter::Write(absl::FunctionRef<absl::Status(SqliteConnection&)> body,
                                   bool synced) {
  Pending mine(body, synced);
  absl::MutexLock lock(&mu_);
  queue_.push_back(&mine);
  while (!mine.done) {
    if (leader_active_) {
      // A batch is in flight (ours may be in it): wait for it to end, then either we are done
      // or we lead the next batch.
      batch_done_.Wait(&mu_);
      continue;
    }
    leader_active_ = true;
    std::vector<Pending*> batch;
    batch.swap(queue_);
    mu_.Unlock();
    RunBatch(batch);
    mu_.Lock();
    for (Pending* p : batch) p->done = true;
    ++stats_.transactions;
    stats_.writes += static_cast<int64_t>(batch.size());
    stats_.largest_batch = std::max<int64_t>(stats_.largest_batch, batch.size());
    leader_active_ = false;
    batch_done_.SignalAll();
  }
  return mine.status;
}

GroupCommitter::Stats GroupCommitter::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void GroupCommitter::RunBatch(const std::vector<Pending*>& batch) {
  SqliteConnection& db = *writer_;
  auto fail_all = [&](const absl::Status& status) {
    for (Pending* p : batch) p->status = status;
  };
  // The level is set outside a transaction (SQLite ignores it inside one), and only when it
  // changes. When setting it fails, the batch fails: it must never commit less synced than asked.
  const bool full = std::any_of(batch.begin(), batch.end(), [](Pending* p) { return p->synced; });
  if (full != writer_full_) {
    if (absl::Status level =
            db.Exec(full ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL");
        !level.ok()) {
      fail_all(level);
      return;
    }
    writer_full_ = full;
  }
  if (absl::Status begin = db.Exec("BEGIN IMMEDIATE"); !begin.ok()) {
    fail_all(begin);
    return;
  }
  // A lone write needs no savepoint: its failure rolls back the whole (its own) transaction.
  const bool alone = batch.size() == 1;
  bool committed_any = false;
  for (Pending* p : batch) {
    if (!alone) {
      if (absl::Status s = db.Exec("SAVEPOINT w"); !s.ok()) {
        (void)db.Exec("ROLLBACK");
        fail_all(s);
        return;
      }
    }
    p->status = p->body(db);
    if (alone) break;
    if (!p->status.ok()) {
      // Undo this body only. If SQLite already rolled the whole transaction back (some I/O
      // errors do), the savepoint is gone: then nothing of the batch can be trusted.
      absl::Status undo = db.Exec("ROLLBACK TO w");
      if (undo.ok()) undo = db.Exec("RELEASE w");
      if (!undo.ok()) {
        (void)db.Exec("ROLLBACK");
        // Earlier bodies lose their changes; later ones never ran (their status is still OK).
        for (Pending* q : batch) {
          if (q->status.ok()) q->status = undo;
        }
        return;
      }
      continue;
    }
    if (absl::Status s = db.Exec("RELEASE w"); !s.ok()) {
      (void)db.Exec("ROLLBACK");
      fail_all(s);
      return;
    }
    committed_any = true;
  }
  if (alone) committed_any = batch.front()->status.ok();
  if (!committed_any) {
    // Every body failed: nothing to make durable.
    (void)db.Exec("ROLLBACK");
    return;
  }
  if (absl::Status commit = db.Exec("COMMIT"); !commit.ok()) {
    // Fails harmlessly when COMMIT itself already ended the transaction.
    (void)db.Exec("ROLLBACK");
    for (Pending* p : batch) {
      if (p->status.ok()) p->status = commit;
    }
  }
}

}  // namespace loom::store
