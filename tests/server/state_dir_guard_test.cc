// Store safety: loomd (LoomdServer in process, real SQLite) refuses to start on a lost database
// when its state directory shows it held jobs, and --start-fresh starts it anyway with the
// quarantine on. The issue: an empty (zero-byte) loomd.db started as a fresh coordinator,
// forgetting every job and killing the running ones.
#include "server/store/state_dir_guard.h"

#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/jobs/default_spec_validator.h"
#include "server/rpc/loomd_server.h"
#include "tests/server/loomd_test_util.h"
#include "tests/server/store_test_util.h"

namespace loom::rpc {
namespace {

using ::testing::HasSubstr;

class StateDirGuardTest : public ::testing::Test {
 protected:
  std::string StateDir() const { return dir_.File("state"); }
  std::string Db() const { return StateDir() + "/loomd.db"; }

  absl::StatusOr<std::unique_ptr<LoomdServer>> Start(bool start_fresh = false) {
    LoomdConfig config;
    config.listen = "127.0.0.1:0";
    config.metrics_listen = "";
    config.state_dir = StateDir();
    config.start_fresh = start_fresh;
    config.insecure = true;  // loopback development mode (security_test.cc covers TLS)
    return LoomdServer::Start(config, &clock_, jobs::MakeSpecValidator());
  }

  // Starts loomd, stores one job, stops.
  void RunOnce() {
    absl::StatusOr<std::unique_ptr<LoomdServer>> server = Start();
    ASSERT_TRUE(server.ok()) << server.status();
    ASSERT_TRUE((*server)->manager()->RegisterNode(testing::CpuNode("n1", 1)).ok());
    ASSERT_TRUE((*server)->manager()->CreateJob(testing::CreateRequest(testing::CpuSpec(1))).ok());
    (*server)->Shutdown();
  }

  // The database as an operator's accident leaves it: the WAL and its index gone too.
  void LoseDatabase(bool keep_file) {
    std::filesystem::remove(Db() + "-wal");
    std::filesystem::remove(Db() + "-shm");
    std::filesystem::remove(Db());
    if (keep_file) std::ofstream(Db()).close();  // 0 bytes
  }

  store::testing::TempDir dir_;
  FakeClock clock_;
};

TEST_F(StateDirGuardTest, ANewStateDirStartsAndIsMarkedAtTheFirstJob) {
  RunOnce();
  EXPECT_TRUE(std::filesystem::exists(StateDir() + "/" + store::kHeldJobsMarker));
  absl::StatusOr<std::unique_ptr<LoomdServer>> again = Start();
  EXPECT_TRUE(again.ok()) << again.status() << ": the database is intact";
}

TEST_F(StateDirGuardTest, AnEmptyDatabaseOverAStateDirThatHeldJobsIsRefused) {
  RunOnce();
  LoseDatabase(/*keep_file=*/true);
  absl::StatusOr<std::unique_ptr<LoomdServer>> refused = Start();
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("is empty (0 bytes)"));
  EXPECT_THAT(refused.status().message(), HasSubstr("--start-fresh"));
  EXPECT_EQ(std::filesystem::file_size(Db()), 0u) << "nothing written on refusal";

  absl::StatusOr<std::unique_ptr<LoomdServer>> fresh = Start(/*start_fresh=*/true);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  // The quarantine is on: an unknown gang reported by a worker is left running.
  jobs::JobManager* manager = (*fresh)->manager();
  ASSERT_TRUE(manager->RegisterNode(testing::CpuNode("n1", 1)).ok());
  v1::SessionHello hello;
  hello.set_node_id("n1");
  v1::RunningJob* running = hello.add_running();
  running->set_job("jobs/before");
  running->set_generation(1);
  auto sink = std::make_shared<testing::FakeSink>();
  ASSERT_TRUE(manager->OpenSession(hello, sink).ok());
  for (const v1::CoordinatorMessage& m : sink->Take()) EXPECT_FALSE(m.has_cancel());
  EXPECT_EQ(manager->ListNodes().nodes(0).quarantined_size(), 1);
}

TEST_F(StateDirGuardTest, AMissingDatabaseWithJobLogsIsRefused) {
  RunOnce();
  std::filesystem::remove(StateDir() + "/" + store::kHeldJobsMarker);
  std::filesystem::create_directories(StateDir() + "/logs/abc");
  std::ofstream(StateDir() + "/logs/abc/output.log") << "1\t0\tstdout\tn\t0\thello\n";
  LoseDatabase(/*keep_file=*/false);
  absl::StatusOr<std::unique_ptr<LoomdServer>> refused = Start();
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("is missing"));
  EXPECT_THAT(refused.status().message(), HasSubstr("logs/ holds the logs of earlier jobs"));
  EXPECT_FALSE(std::filesystem::exists(Db()));
}

TEST_F(StateDirGuardTest, ASchemaLessDatabaseIsRefused) {
  RunOnce();
  LoseDatabase(/*keep_file=*/false);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(Db().c_str(), &db), SQLITE_OK);
  // A valid SQLite file with a page but no table of Loom's.
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE t(x); DROP TABLE t;", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  absl::StatusOr<std::unique_ptr<LoomdServer>> refused = Start();
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("--start-fresh"));
}

}  // namespace
}  // namespace loom::rpc
