// The worker's own checks of a job spec (defence in depth beside loomd's): the env deny-list in
// the assignment validator, spec paths confined to the worker's roots with symbolic links
// resolved, and who the ranks run as.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/agent/assignment_validator.h"
#include "worker/agent/node_identity.h"
#include "worker/agent/path_confinement.h"
#include "worker/agent/rank_user.h"

namespace loom::worker {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::Assignment OneRank() {
  v1::Assignment a;
  a.set_job("jobs/j1");
  a.set_generation(1);
  a.set_world_size(1);
  a.set_num_nodes(1);
  a.mutable_layout()->set_data(1);
  a.mutable_layout()->set_tensor(1);
  a.mutable_layout()->set_pipeline(1);
  v1::RankAssignment* r = a.add_ranks();
  r->set_device_kind(v1::DEVICE_KIND_CPU);
  return a;
}

TEST(WorkerEnvPolicyTest, LoaderAndSearchPathVariablesAreRefusedAtTheWorkerToo) {
  for (const char* name : {"LD_PRELOAD", "LD_LIBRARY_PATH", "PATH", "PYTHONPATH", "GCONV_PATH",
                           "NCCL_NET_PLUGIN", "CUDA_VISIBLE_DEVICES"}) {
    v1::Assignment a = OneRank();
    (*a.mutable_spec()->mutable_env())[name] = "/tmp/x";
    const absl::Status s = ValidateAssignment(a, CpuDevices(1));
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << name;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("assignment.spec.env[\"", name, "\"]")));
  }
  v1::Assignment nul = OneRank();
  (*nul.mutable_spec()->mutable_env())["X"] = std::string("a\0b", 3);
  EXPECT_THAT(std::string(ValidateAssignment(nul, CpuDevices(1)).message()), HasSubstr("NUL"));
  v1::Assignment fine = OneRank();
  (*fine.mutable_spec()->mutable_env())["NCCL_DEBUG"] = "INFO";
  EXPECT_TRUE(ValidateAssignment(fine, CpuDevices(1)).ok());
}

class PathConfinementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "loom-conf-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ + "/data");
    std::filesystem::create_directories(dir_ + "/ckpt");
    std::filesystem::create_directories(dir_ + "/elsewhere");
    std::ofstream(dir_ + "/data/train.bin") << "tokens";
    std::ofstream(dir_ + "/elsewhere/secret") << "top secret bytes";
    roots_.data = {dir_ + "/data"};
    roots_.checkpoint = {dir_ + "/ckpt"};
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  absl::Status Check(const std::string& data, const std::string& checkpoint = "") {
    v1::JobSpec spec;
    spec.mutable_data()->set_path(data);
    spec.mutable_checkpoint()->set_dir(checkpoint);
    return CheckSpecPathsOnNode(spec, roots_);
  }

  std::string dir_;
  PathRoots roots_;
};

TEST_F(PathConfinementTest, AcceptsFilesUnderTheRoots) {
  EXPECT_TRUE(Check(dir_ + "/data/train.bin", dir_ + "/ckpt/run1").ok())
      << Check(dir_ + "/data/train.bin", dir_ + "/ckpt/run1");
}

TEST_F(PathConfinementTest, RefusesASymbolicLinkOutOfTheRoot) {
  std::filesystem::create_symlink(dir_ + "/elsewhere/secret", dir_ + "/data/link.bin");
  const absl::Status s = Check(dir_ + "/data/link.bin");
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("spec.data.path"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("symbolic link"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("--data-roots"));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("top secret")));

  // A linked directory inside the checkpoint root that leads out of it.
  std::filesystem::create_directory_symlink(dir_ + "/elsewhere", dir_ + "/ckpt/out");
  const absl::Status c = Check(dir_ + "/data/train.bin", dir_ + "/ckpt/out/new/run");
  EXPECT_TRUE(absl::IsFailedPrecondition(c)) << c;
  EXPECT_THAT(std::string(c.message()), HasSubstr("spec.checkpoint.dir"));
}

TEST_F(PathConfinementTest, RefusesFilesOutsideMissingOrNotRegularWithoutEchoingThem) {
  const absl::Status outside = Check("/etc/shadow");
  EXPECT_TRUE(absl::IsFailedPrecondition(outside)) << outside;
  EXPECT_THAT(std::string(outside.message()), HasSubstr("\"/etc/shadow\" outside"));

  const absl::Status missing = Check(dir_ + "/data/nope.bin");
  EXPECT_TRUE(absl::IsFailedPrecondition(missing)) << missing;
  EXPECT_THAT(std::string(missing.message()), HasSubstr("No such file"));

  const absl::Status directory = Check(dir_ + "/data");
  EXPECT_THAT(std::string(directory.message()), HasSubstr("is a directory"));
  EXPECT_THAT(std::string(Check(dir_ + "/data/../elsewhere/secret").message()),
              HasSubstr("\"..\""));
}

TEST_F(PathConfinementTest, ResolvesTheExistingPrefixOnly) {
  std::filesystem::create_directory_symlink(dir_ + "/elsewhere", dir_ + "/data/sub");
  const std::string real = std::filesystem::canonical(dir_).string();
  EXPECT_EQ(ResolveExistingPrefix(dir_ + "/data/sub/a/b").value(), real + "/elsewhere/a/b");
  EXPECT_EQ(ResolveExistingPrefix("/").value(), "/");
  EXPECT_FALSE(ResolveExistingPrefix("relative").ok());
}

TEST(RankUserTest, DefaultSecureAsRootAndExplicitOptOut) {
  absl::StatusOr<RankIdentity> as_root = ResolveRankUser("", 0);
  ASSERT_TRUE(as_root.ok()) << as_root.status();
  EXPECT_EQ(as_root->name, "nobody");
  EXPECT_TRUE(as_root->switch_user);
  EXPECT_NE(as_root->uid, 0u);

  absl::StatusOr<RankIdentity> opt_out = ResolveRankUser("root", 0);
  ASSERT_TRUE(opt_out.ok()) << opt_out.status();
  EXPECT_FALSE(opt_out->switch_user);

  absl::StatusOr<RankIdentity> unprivileged = ResolveRankUser("", 4242);
  ASSERT_TRUE(unprivileged.ok());
  EXPECT_FALSE(unprivileged->switch_user);

  const absl::Status other = ResolveRankUser("root", 4242).status();
  EXPECT_TRUE(absl::IsInvalidArgument(other));
  EXPECT_THAT(std::string(other.message()), HasSubstr("--rank-user"));
  EXPECT_THAT(std::string(other.message()), HasSubstr("needs loom-worker to run as root"));

  const absl::Status unknown = ResolveRankUser("no-such-user-loom", 0).status();
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("no user \"no-such-user-loom\""));
}

}  // namespace
}  // namespace loom::worker
