// The spec policies shared by loomd and loom-worker: the env deny-list and limits, spec path
// normalisation and roots, and how errors echo input.
#include <string>

#include "common/echo.h"
#include "common/env_policy.h"
#include "common/spec_path.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Env = google::protobuf::Map<std::string, std::string>;

absl::Status CheckOne(const std::string& name, const std::string& value = "x") {
  Env env;
  env[name] = value;
  return CheckSpecEnv(env, "spec.env");
}

TEST(EnvPolicyTest, RefusesLoaderSearchPathAndPluginVariablesNamingTheField) {
  for (const char* name : {"LD_PRELOAD",
                           "LD_LIBRARY_PATH",
                           "LD_AUDIT",
                           "PATH",
                           "PYTHONPATH",
                           "PYTHONSTARTUP",
                           "GCONV_PATH",
                           "LOCPATH",
                           "NLSPATH",
                           "HOSTALIASES",
                           "MALLOC_CHECK_",
                           "GLIBC_TUNABLES",
                           "LOOM_RANK",
                           "FOO_PRELOAD",
                           "NCCL_NET_PLUGIN",
                           "NCCL_TUNER_PLUGIN",
                           "NCCL_DEBUG_FILE",
                           "NCCL_CONF_FILE",
                           "NCCL_NET",
                           "CUDA_VISIBLE_DEVICES",
                           "CUDA_INJECTION64_PATH",
                           "BASH_ENV",
                           "OPENSSL_CONF",
                           "PERL5LIB",
                           "NODE_OPTIONS"}) {
    const absl::Status s = CheckOne(name);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(s.message(), HasSubstr(std::string("spec.env[\"") + name + "\"]")) << s;
    EXPECT_THAT(s.message(), HasSubstr("remove it")) << s;
  }
}

TEST(EnvPolicyTest, AllowsTuningVariables) {
  for (const char* name : {"NCCL_DEBUG", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS",
                           "CUDA_LAUNCH_BLOCKING", "GLOO_SOCKET_IFNAME", "MY_SETTING", "_X",
                           "WANDB_API_KEY", "PATHOLOGY", "LDX"}) {
    EXPECT_TRUE(CheckOne(name).ok()) << name << ": " << CheckOne(name);
  }
}

TEST(EnvPolicyTest, RefusesBadNamesNulValuesAndOversizedInput) {
  EXPECT_THAT(CheckOne("lower").message(), HasSubstr("[A-Z_][A-Z0-9_]*"));
  EXPECT_THAT(CheckOne("1ABC").message(), HasSubstr("[A-Z_][A-Z0-9_]*"));
  EXPECT_THAT(CheckOne(std::string(kMaxEnvNameBytes + 1, 'A')).message(), HasSubstr("at most"));
  EXPECT_TRUE(CheckOne(std::string(kMaxEnvNameBytes, 'A')).ok());
  EXPECT_THAT(CheckOne("X", std::string("a\0b", 3)).message(), HasSubstr("NUL"));
  EXPECT_THAT(CheckOne("X", std::string(kMaxEnvValueBytes + 1, 'v')).message(),
              HasSubstr("at most 4096"));
  EXPECT_TRUE(CheckOne("X", std::string(kMaxEnvValueBytes, 'v')).ok());

  Env many;
  for (int i = 0; i <= kMaxEnvEntries; ++i) many["V" + std::to_string(i)] = "1";
  EXPECT_THAT(CheckSpecEnv(many, "spec.env").message(), HasSubstr("at most 64"));
  Env big;  // each entry within its limit, the sum beyond the total cap
  for (int i = 0; i < 20; ++i) big["V" + std::to_string(i)] = std::string(kMaxEnvValueBytes, 'v');
  const absl::Status total = CheckSpecEnv(big, "spec.env");
  EXPECT_EQ(total.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(total.message(), HasSubstr("add up to"));
}

TEST(EnvPolicyTest, EchoedNamesAreTruncated) {
  const std::string name = "lower" + std::string(500, 'a');
  const absl::Status s = CheckOne(name);
  EXPECT_THAT(s.message(), Not(HasSubstr(std::string(100, 'a'))));
  EXPECT_THAT(s.message(), HasSubstr("(505 bytes)"));
}

TEST(EchoTest, QuotesEscapesAndTruncates) {
  EXPECT_EQ(Echo("abc"), "\"abc\"");
  EXPECT_EQ(Echo(std::string("a\0\n\"", 4)), "\"a\\x00\\x0a\\\"\"");
  const std::string long_input(200, 'z');
  EXPECT_EQ(Echo(long_input), "\"" + std::string(kMaxEchoBytes, 'z') + "...\" (200 bytes)");
}

TEST(SpecPathTest, NormalisesLexically) {
  EXPECT_EQ(NormalizeSpecPath("/a//b/./c/", "f").value(), "/a/b/c");
  EXPECT_EQ(NormalizeSpecPath("/", "f").value(), "/");
  EXPECT_EQ(NormalizeSpecPath("/data/x.bin", "f").value(), "/data/x.bin");
}

TEST(SpecPathTest, RefusesRelativeDotDotNulAndLongPaths) {
  EXPECT_THAT(NormalizeSpecPath("data/x", "spec.data.path").status().message(),
              HasSubstr("spec.data.path: \"data/x\" is relative"));
  EXPECT_THAT(NormalizeSpecPath("/data/../etc/shadow", "spec.data.path").status().message(),
              HasSubstr("contains \"..\""));
  EXPECT_THAT(NormalizeSpecPath(std::string("/a\0b", 4), "f").status().message(), HasSubstr("NUL"));
  EXPECT_THAT(NormalizeSpecPath("/" + std::string(kMaxSpecPathBytes, 'a'), "f").status().message(),
              HasSubstr("longer than 1024"));
  EXPECT_THAT(NormalizeSpecPath("", "f").status().message(), HasSubstr("relative"));
}

TEST(SpecPathTest, RootsCompareWholeComponents) {
  EXPECT_TRUE(IsUnderRoot("/data", "/data"));
  EXPECT_TRUE(IsUnderRoot("/data/a/b", "/data"));
  EXPECT_FALSE(IsUnderRoot("/data2/a", "/data"));
  EXPECT_FALSE(IsUnderRoot("/dat", "/data"));
  EXPECT_TRUE(IsUnderRoot("/anything", "/"));

  const std::vector<std::string> roots =
      ParseRoots("/data/, /shared//ckpt", "--data-roots").value();
  EXPECT_EQ(roots, (std::vector<std::string>{"/data", "/shared/ckpt"}));
  EXPECT_TRUE(CheckUnderRoots("/data/x.bin", roots, "spec.data.path", "--data-roots").ok());
  EXPECT_TRUE(CheckUnderRoots("/etc/shadow", {}, "spec.data.path", "--data-roots").ok());
  const absl::Status out = CheckUnderRoots("/etc/shadow", roots, "spec.data.path", "--data-roots");
  EXPECT_EQ(out.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out.message(), HasSubstr("spec.data.path: \"/etc/shadow\" is outside"));
  EXPECT_THAT(out.message(), HasSubstr("--data-roots"));
  EXPECT_THAT(ParseRoots("/ok,rel", "--data-roots").status().message(),
              HasSubstr("--data-roots: \"rel\" is relative"));
}

}  // namespace
}  // namespace loom
