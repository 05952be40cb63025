// What only the SQLite store promises beyond the conformance suite: durability across
// close/reopen, refusing files that are not Loom databases, WAL mode, several writers (threads
// and a second store on the same file), and damaged rows reported instead of crashing.
#include <sqlite3.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/job_store.h"
#include "tests/server/store_test_util.h"

namespace loom::store {
namespace {

using ::loom::store::testing::MakeEvent;
using ::loom::store::testing::MakeJob;
using ::loom::store::testing::MakeNode;
using ::loom::store::testing::TempDir;
using ::testing::HasSubstr;

// Runs one SQL statement on `path` outside the store and returns the first column of the first
// row as text ("" when there is none).
std::string RawSql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  std::string value;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK) {
    if (sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_text(stmt, 0) != nullptr) {
      value = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    }
  } else {
    ADD_FAILURE() << sql << ": " << sqlite3_errmsg(db);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return value;
}

v1::JobEvent Created() { return MakeEvent(v1::JOB_STATE_UNSPECIFIED, v1::QUEUED, "created"); }

TEST(SqliteJobStoreTest, DataSurvivesCloseAndReopen) {
  TempDir dir;
  const std::string path = dir.File("loom.db");
  int64_t last = 0;
  {
    auto store = OpenSqliteJobStore(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->CreateJob(MakeJob("a", v1::QUEUED, "req-a"), Created()).ok());
    auto b = (*store)->CreateJob(MakeJob("b"), Created());
    ASSERT_TRUE(b.ok());
    last = *b;
    v1::Job running = MakeJob("a", v1::RUNNING);
    ASSERT_TRUE((*store)->UpdateJob(running, MakeEvent(v1::QUEUED, v1::RUNNING, "started")).ok());
    ASSERT_TRUE((*store)->PutNode(MakeNode("n1", 4)).ok());
  }
  auto store = OpenSqliteJobStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto a = (*store)->GetJob("jobs/a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->job.state(), v1::RUNNING);
  EXPECT_EQ(a->job.request_id(), "req-a");
  auto by_request = (*store)->FindJobByRequestId("req-a");
  ASSERT_TRUE(by_request.ok() && by_request->has_value());
  auto events = (*store)->ListEvents("jobs/a");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[1].reason(), "started");
  auto nodes = (*store)->ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].devices_size(), 4);
  EXPECT_EQ((*store)->ListActiveJobs()->size(), 2u);

  // Sequences keep increasing after a reopen (so page tokens stay valid).
  auto c = (*store)->CreateJob(MakeJob("c"), Created());
  ASSERT_TRUE(c.ok());
  EXPECT_GT(*c, last);
  // And the unique constraints are still enforced.
  EXPECT_EQ((*store)->CreateJob(MakeJob("a"), Created()).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ((*store)->CreateJob(MakeJob("d", v1::QUEUED, "req-a"), Created()).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(SqliteJobStoreTest, UsesWalModeAndRecordsItsSchemaVersion) {
  TempDir dir;
  const std::string path = dir.File("loom.db");
  ASSERT_TRUE(OpenSqliteJobStore(path).ok());
  EXPECT_EQ(RawSql(path, "PRAGMA journal_mode"), "wal");
  EXPECT_EQ(RawSql(path, "PRAGMA user_version"), "1");
  EXPECT_EQ(RawSql(path, "PRAGMA application_id"), std::to_string(0x4C4F4F4D));
}

TEST(SqliteJobStoreTest, AGarbageFileIsRejectedNamingThePath) {
  TempDir dir;
  const std::string path = dir.File("garbage.db");
  {
    std::ofstream out(path, std::ios::binary);
    for (int i = 0; i < 512; ++i) out << "this is not a database ";
  }
  auto store = OpenSqliteJobStore(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("not a Loom database"));
  // The file is left as it was.
  std::ifstream in(path, std::ios::binary);
  std::string head(23, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  EXPECT_EQ(head, "this is not a database ");
}

TEST(SqliteJobStoreTest, AnotherProgramsSqliteDatabaseIsRejected) {
  TempDir dir;
  const std::string path = dir.File("other.db");
  RawSql(path, "CREATE TABLE songs (title TEXT)");
  auto store = OpenSqliteJobStore(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("not a Loom database"));
  EXPECT_EQ(RawSql(path, "SELECT count(*) FROM sqlite_master"), "1") << "nothing was added";
}

TEST(SqliteJobStoreTest, ANewerSchemaVersionIsRejected) {
  TempDir dir;
  const std::string path = dir.File("loom.db");
  ASSERT_TRUE(OpenSqliteJobStore(path).ok());
  RawSql(path, "PRAGMA user_version = 99");
  auto store = OpenSqliteJobStore(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("schema version 99"));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(path));
}

TEST(SqliteJobStoreTest, AMissingDirectoryIsAClearError) {
  TempDir dir;
  const std::string path = dir.File("no/such/dir/loom.db");
  auto store = OpenSqliteJobStore(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(path));
}

TEST(SqliteJobStoreTest, ADamagedRowIsDataLossNotACrash) {
  TempDir dir;
  const std::string path = dir.File("loom.db");
  auto store = OpenSqliteJobStore(path);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->CreateJob(MakeJob("a"), Created()).ok());
  RawSql(path, "UPDATE jobs SET job = x'ffffffff' WHERE name = 'jobs/a'");
  auto job = (*store)->GetJob("jobs/a");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("loom.v1.Job"));
  EXPECT_EQ((*store)->ListJobs(std::nullopt, 0, 10).status().code(), absl::StatusCode::kDataLoss);
}

TEST(SqliteJobStoreTest, ConcurrentWritersFromSeveralThreadsAndTwoStores) {
  TempDir dir;
  const std::string path = dir.File("loom.db");
  auto first = OpenSqliteJobStore(path);
  auto second = OpenSqliteJobStore(path);  // as a second process would: its own connections
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE((*first)->CreateJob(MakeJob("shared"), Created()).ok());

  constexpr int kThreads = 6;
  constexpr int kPerThread = 25;
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int t = 0; t < kThreads; ++t) {
    JobStore* store = (t % 2 == 0 ? *first : *second).get();
    threads.emplace_back([&, t, store] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string id = "w" + std::to_string(t) + "-" + std::to_string(i);
        if (!store->CreateJob(MakeJob(id), Created()).ok()) ++errors;
        // Every thread also appends to one shared job's log.
        if (!store->UpdateJob(MakeJob("shared"), MakeEvent(v1::QUEUED, v1::QUEUED, id)).ok()) {
          ++errors;
        }
        if (!store->ListJobs(std::nullopt, 0, 5).ok()) ++errors;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(errors, 0);

  auto page = (*first)->ListJobs(std::nullopt, 0, 10000);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->jobs.size(), static_cast<size_t>(1 + kThreads * kPerThread));
  auto events = (*second)->ListEvents("jobs/shared");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), static_cast<size_t>(1 + kThreads * kPerThread));
  std::set<std::string> reasons;
  for (int i = 0; i < static_cast<int>(events->size()); ++i) {
    EXPECT_EQ((*events)[i].sequence(), i + 1) << "no gaps, no duplicates";
    reasons.insert((*events)[i].reason());
  }
  EXPECT_EQ(reasons.size(), events->size());
}

}  // namespace
}  // namespace loom::store
