// GroupCommitter (server/store/group_commit.h): concurrent writes share transactions, a failing
// write in a shared batch loses only its own changes, and every write is visible (committed)
// when Write returns.
#include "server/store/group_commit.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/server/store_test_util.h"

namespace loom::store {
namespace {

using ::loom::store::testing::TempDir;

std::unique_ptr<SqliteConnection> OpenDb(const std::string& path) {
  absl::StatusOr<std::unique_ptr<SqliteConnection>> db = SqliteConnection::Open(path, true);
  EXPECT_TRUE(db.ok()) << db.status();
  EXPECT_TRUE((*db)->Exec("PRAGMA journal_mode = WAL").ok());
  EXPECT_TRUE((*db)->Exec("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY)").ok());
  return *std::move(db);
}

absl::Status Insert(SqliteConnection& db, const std::string& key) {
  absl::StatusOr<Statement> insert = db.Prepare("INSERT INTO t (k) VALUES (?)");
  if (!insert.ok()) return insert.status();
  insert->BindText(1, key);
  return insert->Step().status();
}

// Whether `key` is committed, read through a second connection (it sees only commits).
bool Committed(const std::string& path, const std::string& key) {
  absl::StatusOr<std::unique_ptr<SqliteConnection>> db = SqliteConnection::Open(path, false);
  EXPECT_TRUE(db.ok()) << db.status();
  absl::StatusOr<Statement> find = (*db)->Prepare("SELECT 1 FROM t WHERE k = ?");
  EXPECT_TRUE(find.ok()) << find.status();
  find->BindText(1, key);
  absl::StatusOr<bool> row = find->Step();
  EXPECT_TRUE(row.ok()) << row.status();
  return row.ok() && *row;
}

TEST(GroupCommitTest, ALoneWriteCommitsAloneAndAFailedOneWritesNothing) {
  TempDir dir;
  const std::string path = dir.File("t.db");
  GroupCommitter committer(OpenDb(path));
  EXPECT_TRUE(committer.Write([](SqliteConnection& db) { return Insert(db, "a"); }).ok());
  EXPECT_TRUE(Committed(path, "a"));
  const absl::Status failed = committer.Write([](SqliteConnection& db) {
    if (absl::Status s = Insert(db, "b"); !s.ok()) return s;
    return absl::InvalidArgumentError("refused after writing");
  });
  EXPECT_TRUE(absl::IsInvalidArgument(failed)) << failed;
  EXPECT_FALSE(Committed(path, "b"));
  EXPECT_EQ(committer.stats().transactions, 2);
}

TEST(GroupCommitTest, WritersThatQueueBehindABatchShareOneTransaction) {
  TempDir dir;
  const std::string path = dir.File("t.db");
  GroupCommitter committer(OpenDb(path));
  constexpr int kWriters = 16;
  absl::Notification release;
  std::atomic<int> queued{0};
  // The first write holds the connection until every other writer has called Write, so that
  // they all queue up behind it and must form one batch.
  std::thread first([&] {
    EXPECT_TRUE(committer
                    .Write([&](SqliteConnection& db) {
                      release.WaitForNotification();
                      return Insert(db, "first");
                    })
                    .ok());
  });
  absl::SleepFor(absl::Milliseconds(20));  // the first write is now the leader, blocked
  std::vector<std::thread> writers;
  std::vector<absl::Status> results(kWriters);
  for (int i = 0; i < kWriters; ++i) {
    writers.emplace_back([&, i] {
      queued.fetch_add(1);
      results[i] = committer.Write([&, i](SqliteConnection& db) -> absl::Status {
        // Every third writer fails after writing: only its own row must disappear.
        if (absl::Status s = Insert(db, absl::StrCat("w", i)); !s.ok()) return s;
        if (i % 3 == 0) return absl::AlreadyExistsError("refused");
        return absl::OkStatus();
      });
      // Acknowledged means committed: visible to another connection right now.
      if (results[i].ok()) {
        EXPECT_TRUE(Committed(path, absl::StrCat("w", i)));
      }
    });
  }
  while (queued.load() < kWriters) absl::SleepFor(absl::Milliseconds(1));
  absl::SleepFor(absl::Milliseconds(50));  // let the last ones reach the queue
  release.Notify();
  first.join();
  for (std::thread& t : writers) t.join();

  for (int i = 0; i < kWriters; ++i) {
    EXPECT_EQ(results[i].ok(), i % 3 != 0) << i << ": " << results[i];
    EXPECT_EQ(Committed(path, absl::StrCat("w", i)), i % 3 != 0) << i;
  }
  EXPECT_TRUE(Committed(path, "first"));
  const GroupCommitter::Stats stats = committer.stats();
  EXPECT_EQ(stats.writes, kWriters + 1);
  // The first alone, then the queued writers together (one batch, or a few if a thread was
  // slow to reach Write): far fewer transactions than writes.
  EXPECT_LE(stats.transactions, 4);
  EXPECT_GE(stats.largest_batch, kWriters / 2);
}

// The synchronous level a body's transaction commits under (1 NORMAL, 2 FULL).
int SyncLevel(SqliteConnection& db) {
  absl::StatusOr<Statement> pragma = db.Prepare("PRAGMA synchronous");
  EXPECT_TRUE(pragma.ok()) << pragma.status();
  absl::StatusOr<bool> row = pragma->Step();
  EXPECT_TRUE(row.ok() && *row);
  return static_cast<int>(pragma->ColumnInt(0));
}

// An unsynced write commits under NORMAL (no WAL sync) and is committed all the same; a synced
// write gets FULL back; and a batch that holds any synced write commits under FULL, so a synced
// write never loses its sync by sharing a batch.
TEST(GroupCommitTest, OnlyABatchOfUnsyncedWritesSkipsTheSync) {
  TempDir dir;
  const std::string path = dir.File("t.db");
  std::unique_ptr<SqliteConnection> writer = OpenDb(path);
  ASSERT_TRUE(writer->Exec("PRAGMA synchronous = FULL").ok());
  GroupCommitter committer(std::move(writer));
  int level = 0;
  auto write = [&](const std::string& key, bool synced, int* seen) {
    return committer.Write(
        [&, seen](SqliteConnection& db) {
          *seen = SyncLevel(db);
          return Insert(db, key);
        },
        synced);
  };
  ASSERT_TRUE(write("unsynced", false, &level).ok());
  EXPECT_EQ(level, 1);
  EXPECT_TRUE(Committed(path, "unsynced"));
  ASSERT_TRUE(write("synced", true, &level).ok());
  EXPECT_EQ(level, 2);
  ASSERT_TRUE(write("unsynced-again", false, &level).ok());
  EXPECT_EQ(level, 1);

  // An unsynced and a synced write queued behind a blocked leader form one batch: FULL.
  absl::Notification release;
  int leader_level = 0, a = 0, b = 0;
  std::thread leader([&] {
    EXPECT_TRUE(committer
                    .Write(
                        [&](SqliteConnection& db) {
                          release.WaitForNotification();
                          leader_level = SyncLevel(db);
                          return Insert(db, "leader");
                        },
                        false)
                    .ok());
  });
  absl::SleepFor(absl::Milliseconds(20));  // the leader now holds the connection
  std::thread t1([&] { EXPECT_TRUE(write("queued-unsynced", false, &a).ok()); });
  std::thread t2([&] { EXPECT_TRUE(write("queued-synced", true, &b).ok()); });
  absl::SleepFor(absl::Milliseconds(50));  // both are queued
  release.Notify();
  leader.join();
  t1.join();
  t2.join();
  EXPECT_EQ(leader_level, 1);
  EXPECT_EQ(b, 2);
  // Together (the usual case), the unsynced one rides the synced batch; a thread slow to reach
  // Write on a loaded machine commits alone, unsynced.
  if (committer.stats().largest_batch == 2) {
    EXPECT_EQ(a, 2);
  } else {
    EXPECT_EQ(a, 1);
  }
}

TEST(GroupCommitTest, AConstraintFailureInsideABatchKeepsTheOthers) {
  // A failure raised by SQLite itself (a duplicate key) rather than by the body's own logic.
  TempDir dir;
  const std::string path = dir.File("t.db");
  GroupCommitter committer(OpenDb(path));
  ASSERT_TRUE(committer.Write([](SqliteConnection& db) { return Insert(db, "dup"); }).ok());
  constexpr int kWriters = 8;
  std::vector<std::thread> writers;
  std::vector<absl::Status> results(kWriters);
  for (int i = 0; i < kWriters; ++i) {
    writers.emplace_back([&, i] {
      results[i] = committer.Write([&, i](SqliteConnection& db) -> absl::Status {
        if (absl::Status s = Insert(db, absl::StrCat("k", i)); !s.ok()) return s;
        return i % 2 == 0 ? Insert(db, "dup") : absl::OkStatus();
      });
    });
  }
  for (std::thread& t : writers) t.join();
  for (int i = 0; i < kWriters; ++i) {
    EXPECT_EQ(results[i].ok(), i % 2 != 0) << i << ": " << results[i];
    EXPECT_EQ(Committed(path, absl::StrCat("k", i)), i % 2 != 0) << i;
  }
}

}  // namespace
}  // namespace loom::store
