// JobDirPool: spares made ahead, taken whole with the spec in them, declined (leaving the
// caller to make the directory) when none is ready, when the job's directory exists, and for
// good once the file system refuses; leftovers of an earlier worker removed at start.
#include "worker/agent/job_dir_pool.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace loom::worker {
namespace {

namespace fs = std::filesystem;

class JobDirPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "loom-dirpool-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  static mode_t Mode(const std::string& path) {
    struct stat info {};
    EXPECT_EQ(::lstat(path.c_str(), &info), 0) << path;
    return info.st_mode & 07777;
  }
  int Spares() const {
    int n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_ + "/spare-job-dirs")) ++n;
    return n;
  }

  std::string dir_;
};

TEST_F(JobDirPoolTest, ASpareBecomesTheJobsDirectoryWithItsSpec) {
  fs::create_directories(dir_ + "/spare-job-dirs/7/checkpoints");  // left by an earlier worker
  JobDirPool pool(dir_, 2);
  ASSERT_TRUE(pool.Init().ok());
  EXPECT_EQ(Spares(), 0);
  EXPECT_EQ(Mode(dir_ + "/spare-job-dirs"), 0700u);  // no rank can reach a spare
  EXPECT_FALSE(pool.Take(dir_ + "/jobs/a", "{}"));  // none ready yet
  EXPECT_FALSE(fs::exists(dir_ + "/jobs/a"));
  for (int i = 0; i < 3; ++i) pool.Refill();
  EXPECT_EQ(pool.ready(), 2);  // the target, not more
  EXPECT_EQ(Spares(), 2);

  ASSERT_TRUE(pool.Take(dir_ + "/jobs/a", R"({"name": "a"})"));
  EXPECT_EQ(pool.ready(), 1);
  EXPECT_EQ(Spares(), 1);
  EXPECT_EQ(Read(dir_ + "/jobs/a/spec.json"), R"({"name": "a"})");
  EXPECT_TRUE(fs::is_directory(dir_ + "/jobs/a/checkpoints"));
  EXPECT_TRUE(fs::is_empty(dir_ + "/jobs/a/checkpoints"));
  // The modes a directory made on demand gets.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  EXPECT_EQ(Mode(dir_ + "/jobs/a"), 0777u & ~mask);
  EXPECT_EQ(Mode(dir_ + "/jobs/a/spec.json"), 0644u & ~mask);
}

TEST_F(JobDirPoolTest, AnExistingDirectoryIsLeftAloneAndTheSpareKept) {
  JobDirPool pool(dir_, 1);
  ASSERT_TRUE(pool.Init().ok());
  pool.Refill();
  fs::create_directories(dir_ + "/jobs/again");
  std::ofstream(dir_ + "/jobs/again/spec.json") << "the first generation's";
  EXPECT_FALSE(pool.Take(dir_ + "/jobs/again", "a longer spec that the next job must not see"));
  EXPECT_EQ(Read(dir_ + "/jobs/again/spec.json"), "the first generation's");
  EXPECT_TRUE(pool.enabled());
  EXPECT_EQ(pool.ready(), 1);
  ASSERT_TRUE(pool.Take(dir_ + "/jobs/next", "short"));
  EXPECT_EQ(Read(dir_ + "/jobs/next/spec.json"), "short");  // nothing left of the longer one
}

TEST_F(JobDirPoolTest, AFileSystemRefusalTurnsThePoolOff) {
  JobDirPool pool(dir_, 2);
  ASSERT_TRUE(pool.Init().ok());
  pool.Refill();
  pool.Refill();
  fs::remove(dir_ + "/jobs");
  std::ofstream(dir_ + "/jobs") << "not a directory";
  EXPECT_FALSE(pool.Take(dir_ + "/jobs/x", "{}"));
  EXPECT_FALSE(pool.enabled());
  fs::remove(dir_ + "/jobs");
  fs::create_directories(dir_ + "/jobs");
  EXPECT_FALSE(pool.Take(dir_ + "/jobs/x", "{}"));  // off for good: made on demand from now on
  EXPECT_FALSE(fs::exists(dir_ + "/jobs/x"));
}

TEST_F(JobDirPoolTest, OnlyItsOwnLeftoversAreRemovedAndOnlyFromItsOwnFolder) {
  fs::create_directories(dir_ + "/spare-job-dirs/12");
  std::ofstream(dir_ + "/spare-job-dirs/notes.txt") << "not a spare";
  fs::permissions(dir_ + "/spare-job-dirs", fs::perms::all);
  JobDirPool pool(dir_, 1);
  ASSERT_TRUE(pool.Init().ok());
  EXPECT_FALSE(fs::exists(dir_ + "/spare-job-dirs/12"));
  EXPECT_EQ(Read(dir_ + "/spare-job-dirs/notes.txt"), "not a spare");
  EXPECT_EQ(Mode(dir_ + "/spare-job-dirs"), 0700u);

  // Not a folder: the pool stays off and says what to do.
  fs::remove_all(dir_ + "/spare-job-dirs");
  std::ofstream(dir_ + "/spare-job-dirs") << "someone's file";
  JobDirPool blocked(dir_, 1);
  absl::Status status = blocked.Init();
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_NE(status.message().find("spare-job-dirs exists but is not a folder"), std::string::npos)
      << status;
  blocked.Refill();
  EXPECT_FALSE(blocked.enabled());
  EXPECT_EQ(Read(dir_ + "/spare-job-dirs"), "someone's file");

  // A relative or empty work dir: off, nothing touched.
  for (const char* work_dir : {"", "relative/work"}) {
    JobDirPool relative(work_dir, 1);
    EXPECT_TRUE(absl::IsInvalidArgument(relative.Init()));
    EXPECT_FALSE(relative.enabled());
  }
}

TEST_F(JobDirPoolTest, ATargetOfZeroMakesNothing) {
  JobDirPool pool(dir_, 0);
  ASSERT_TRUE(pool.Init().ok());
  pool.Refill();
  EXPECT_FALSE(pool.enabled());
  EXPECT_FALSE(fs::exists(dir_ + "/spare-job-dirs"));
  EXPECT_FALSE(pool.Take(dir_ + "/jobs/x", "{}"));
}

}  // namespace
}  // namespace loom::worker
