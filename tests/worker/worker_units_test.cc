// Unit tests of the worker's pure parts: line splitting, progress parsing, exit classification,
// assignment validation, the rank environment, node identity and node metrics.
#include <sys/wait.h>

#include <csignal>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/agent/assignment_validator.h"
#include "worker/agent/line_splitter.h"
#include "worker/agent/node_identity.h"
#include "worker/agent/node_metrics.h"
#include "worker/agent/progress_parser.h"
#include "worker/agent/rank_environment.h"
#include "worker/agent/rank_exit.h"

namespace loom::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Split(LineSplitter& s, const std::vector<std::string>& chunks,
                               bool flush = true) {
  std::vector<std::string> lines;
  for (const std::string& c : chunks) s.Append(c, [&](std::string l) { lines.push_back(l); });
  if (flush) s.Flush([&](std::string l) { lines.push_back(l); });
  return lines;
}

TEST(LineSplitterTest, JoinsPiecesAndSplitsManyLines) {
  LineSplitter s(100);
  EXPECT_THAT(Split(s, {"hel", "lo\nwor", "ld\r\n\nlast"}),
              ElementsAre("hello", "world", "", "last"));
}

TEST(LineSplitterTest, CutsOverlongLinesAndDropsTheirTail) {
  LineSplitter s(4);
  EXPECT_THAT(Split(s, {"abcdefgh", "ij\nxy\n"}), ElementsAre("abcd", "xy"));
  EXPECT_EQ(s.truncated_lines(), 1u);
}

TEST(LineSplitterTest, RepairsInvalidUtf8) {
  EXPECT_EQ(SanitizeUtf8("ok \xC3\xA9"), "ok \xC3\xA9");
  EXPECT_EQ(SanitizeUtf8("a\xFF"
                         "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(SanitizeUtf8("\xE2\x82"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // truncated sequence
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  LineSplitter s(3);
  // A cut inside a two-byte character leaves a valid line.
  EXPECT_THAT(Split(s, {"ab\xC3\xA9\n"}), ElementsAre("ab\xEF\xBF\xBD"));
}

TEST(ProgressParserTest, StepLine) {
  auto r = ParseProgressLine(
      R"({"event":"step","rank":0,"step":12,"total_steps":200,"loss":3.91,"lr":0.0006,)"
      R"("grad_norm":1.2,"tokens_per_second":5120.0,"step_seconds":0.1,)"
      R"("phases":{"data":0.001,"forward":0.03},"memory_bytes":1048576,)"
      R"("peak_memory_bytes":2097152,"future_field":[1,2]})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  const v1::StepReport& s = **r;
  EXPECT_EQ(s.step(), 12);
  EXPECT_EQ(s.total_steps(), 200);
  EXPECT_DOUBLE_EQ(s.loss(), 3.91);
  EXPECT_DOUBLE_EQ(s.lr(), 0.0006);
  EXPECT_DOUBLE_EQ(s.grad_norm(), 1.2);
  EXPECT_DOUBLE_EQ(s.tokens_per_second(), 5120.0);
  EXPECT_DOUBLE_EQ(s.step_seconds(), 0.1);
  EXPECT_DOUBLE_EQ(s.phase_seconds().at("forward"), 0.03);
  EXPECT_EQ(s.memory_bytes(), 1048576u);
  EXPECT_EQ(s.peak_memory_bytes(), 2097152u);
  EXPECT_FALSE(s.has_val_loss());
}

TEST(ProgressParserTest, EvalLineAndOtherEvents) {
  auto eval = ParseProgressLine(R"({"event":"eval","rank":0,"step":50,"val_loss":3.2})");
  ASSERT_TRUE(eval.ok() && eval->has_value());
  EXPECT_TRUE((*eval)->has_val_loss());
  EXPECT_DOUBLE_EQ((*eval)->val_loss(), 3.2);
  EXPECT_EQ((*eval)->step(), 50);
  // Checkpoints are forwarded (loomd's watchdog counts them as progress), other events are not.
  auto ckpt = ParseProgressLine(R"({"event":"checkpoint","rank":0,"step":100,"dir":"x"})");
  ASSERT_TRUE(ckpt.ok() && ckpt->has_value());
  EXPECT_TRUE((*ckpt)->checkpoint());
  EXPECT_EQ((*ckpt)->step(), 100);
  EXPECT_FALSE((*ckpt)->has_val_loss());
  auto other = ParseProgressLine(R"({"event":"resume","rank":0,"step":100})");
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->has_value());
}

TEST(ProgressParserTest, MalformedLinesAreErrors) {
  for (const char* line :
       {"", "not json", "[1,2]", "42", R"({"step":1})", R"({"event":3})", R"({"event":"step"})",
        R"({"event":"step","step":-1})", R"({"event":"step","step":1.5})",
        R"({"event":"step","step":"7"})", R"({"event":"step","step":1,"loss":"x"})",
        R"({"event":"step","step":1,"phases":[1]})",
        R"({"event":"step","step":1,"phases":{"a":"b"}})", R"({"event":"eval","step":1})",
        R"({"event":"step","step":1e300})"}) {
    EXPECT_FALSE(ParseProgressLine(line).ok()) << line;
  }
}

// The parallel runtime's fields (docs/rank-contract.md) reach the StepReport as sent.
TEST(ProgressParserTest, CommBytesAndRatios) {
  auto r = ParseProgressLine(
      R"({"event":"step","rank":1,"step":3,"total_steps":10,"step_seconds":0.2,)"
      R"("comm_bytes":{"all_reduce":880640,"tp_all_reduce":0,"pp_send_recv":4096},)"
      R"("overlap_ratio":0.5,"bubble_ratio":0.25,"idle_ratio":0.125})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  const v1::StepReport& s = **r;
  EXPECT_EQ(s.comm_bytes().size(), 3u);
  EXPECT_EQ(s.comm_bytes().at("all_reduce"), 880640u);
  EXPECT_EQ(s.comm_bytes().at("tp_all_reduce"), 0u);
  EXPECT_EQ(s.comm_bytes().at("pp_send_recv"), 4096u);
  EXPECT_DOUBLE_EQ(s.overlap_ratio(), 0.5);
  EXPECT_DOUBLE_EQ(s.bubble_ratio(), 0.25);
  EXPECT_DOUBLE_EQ(s.idle_ratio(), 0.125);

  // Absent fields (an older loom-train) read as zero, not as an error.
  auto old = ParseProgressLine(R"({"event":"step","step":3})");
  ASSERT_TRUE(old.ok() && old->has_value()) << old.status();
  EXPECT_TRUE((*old)->comm_bytes().empty());
  EXPECT_DOUBLE_EQ((*old)->idle_ratio(), 0.0);
}

// The profiler's memory fields of a GPU rank, in loom-train's order (docs/rank-contract.md).
TEST(ProgressParserTest, MemoryStatistics) {
  auto r = ParseProgressLine(
      R"({"event":"step","rank":0,"step":7,"total_steps":50,"memory_bytes":3145728,)"
      R"("peak_memory_bytes":5242880,"rss_bytes":409600000,"reserved_memory_bytes":23068672,)"
      R"("memory_fragmentation":0.25,"device_allocations":2,"device":"cuda:1"})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  const v1::StepReport& s = **r;
  EXPECT_EQ(s.memory_bytes(), 3145728u);
  EXPECT_EQ(s.peak_memory_bytes(), 5242880u);
  EXPECT_EQ(s.rss_bytes(), 409600000u);
  EXPECT_EQ(s.reserved_memory_bytes(), 23068672u);
  EXPECT_DOUBLE_EQ(s.memory_fragmentation(), 0.25);
  EXPECT_EQ(s.device_allocations(), 2u);
  EXPECT_EQ(s.device(), "cuda:1");

  auto cpu = ParseProgressLine(
      R"({"event":"step","step":1,"memory_bytes":1024,"reserved_memory_bytes":1024,)"
      R"("memory_fragmentation":0,"device_allocations":0,"device":"cpu"})");
  ASSERT_TRUE(cpu.ok() && cpu->has_value()) << cpu.status();
  EXPECT_EQ((*cpu)->reserved_memory_bytes(), 1024u);
  EXPECT_EQ((*cpu)->device(), "cpu");

  // A rank older than these fields: zero and empty, not an error.
  auto old = ParseProgressLine(R"({"event":"step","step":3,"memory_bytes":1024})");
  ASSERT_TRUE(old.ok() && old->has_value()) << old.status();
  EXPECT_EQ((*old)->rss_bytes(), 0u);
  EXPECT_EQ((*old)->reserved_memory_bytes(), 0u);
  EXPECT_DOUBLE_EQ((*old)->memory_fragmentation(), 0.0);
  EXPECT_EQ((*old)->device_allocations(), 0u);
  EXPECT_EQ((*old)->device(), "");
}

// A sampled step's per-block costs (docs/rank-contract.md "block_seconds").
TEST(ProgressParserTest, BlockSeconds) {
  auto r = ParseProgressLine(
      R"({"event":"step","rank":1,"step":8,"step_seconds":0.1,"block_seconds":{"first_block":2,)"
      R"("forward":[0.01,0.02],"backward":[0.03,0.04],"head":[0.05,0.06]}})");
  ASSERT_TRUE(r.ok() && r->has_value()) << r.status();
  ASSERT_TRUE((*r)->has_block_costs());
  const v1::BlockCosts& b = (*r)->block_costs();
  EXPECT_EQ(b.first_block(), 2);
  ASSERT_EQ(b.forward_seconds_size(), 2);
  EXPECT_DOUBLE_EQ(b.forward_seconds(1), 0.02);
  EXPECT_DOUBLE_EQ(b.backward_seconds(0), 0.03);
  EXPECT_FALSE(b.has_embedding());
  EXPECT_TRUE(b.has_head());
  EXPECT_DOUBLE_EQ(b.head_forward_seconds(), 0.05);
  EXPECT_DOUBLE_EQ(b.head_backward_seconds(), 0.06);

  auto none = ParseProgressLine(R"({"event":"step","step":3,"step_seconds":0.1})");
  ASSERT_TRUE(none.ok() && none->has_value());
  EXPECT_FALSE((*none)->has_block_costs());

  for (
      const char* bad : {
          R"({"event":"step","step":1,"block_seconds":[1]})",
          R"({"event":"step","step":1,"block_seconds":{"first_block":0,"forward":[1]}})",
          R"({"event":"step","step":1,"block_seconds":{"forward":[1],"backward":[1,2]}})",
          R"({"event":"step","step":1,"block_seconds":{"forward":[-1],"backward":[1]}})",
          R"({"event":"step","step":1,"block_seconds":{"forward":["x"],"backward":[1]}})",
          R"({"event":"step","step":1,"block_seconds":{"first_block":-2,"forward":[],"backward":[]}})",
          R"({"event":"step","step":1,"block_seconds":{"forward":[],"backward":[],"head":[1]}})",
      }) {
    auto e = ParseProgressLine(bad);
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.status().message().find("block_seconds"), std::string::npos) << e.status();
  }
}

TEST(ProgressParserTest, BadMemoryStatisticsAreErrors) {
  struct Case {
    const char* line;
    const char* error;  // what the message must name
  };
  for (const Case& c : {
           Case{R"({"event":"step","step":1,"rss_bytes":-1})",
                "\"rss_bytes\" must be a non-negative integer"},
           Case{R"({"event":"step","step":1,"reserved_memory_bytes":"22"})",
                "\"reserved_memory_bytes\" must be a non-negative integer"},
           Case{R"({"event":"step","step":1,"reserved_memory_bytes":1.5})",
                "\"reserved_memory_bytes\" must be a non-negative integer"},
           Case{R"({"event":"step","step":1,"device_allocations":true})",
                "\"device_allocations\" must be a non-negative integer"},
           Case{R"({"event":"step","step":1,"memory_fragmentation":"0.5"})",
                "\"memory_fragmentation\" must be a finite number"},
           Case{R"({"event":"step","step":1,"memory_fragmentation":1.5})",
                "\"memory_fragmentation\" must be in [0, 1]"},
           Case{R"({"event":"step","step":1,"memory_fragmentation":-0.5})",
                "\"memory_fragmentation\" must be in [0, 1]"},
           Case{R"({"event":"step","step":1,"device":0})", "\"device\" must be a string"},
           Case{R"({"event":"step","step":1,"device":["cuda:0"]})", "\"device\" must be a string"},
       }) {
    auto r = ParseProgressLine(c.line);
    ASSERT_FALSE(r.ok()) << c.line;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.line;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.error)) << c.line;
  }
  const std::string long_device =
      R"({"event":"step","step":1,"device":")" + std::string(65, 'c') + R"("})";
  EXPECT_EQ(ParseProgressLine(long_device).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ProgressParserTest, BadCommBytesAndRatiosAreErrors) {
  struct Case {
    const char* line;
    const char* error;  // what the message must name
  };
  for (const Case& c : {
           Case{R"({"event":"step","step":1,"idle_ratio":1.5})",
                "\"idle_ratio\" must be in [0, 1]"},
           Case{R"({"event":"step","step":1,"bubble_ratio":-0.1})",
                "\"bubble_ratio\" must be in [0, 1]"},
           Case{R"({"event":"step","step":1,"overlap_ratio":2})",
                "\"overlap_ratio\" must be in [0, 1]"},
           Case{R"({"event":"step","step":1,"idle_ratio":"0.5"})", "\"idle_ratio\""},
           Case{R"({"event":"step","step":1,"comm_bytes":{"all_reduce":-1}})",
                "entry \"all_reduce\" must be a non-negative integer"},
           Case{R"({"event":"step","step":1,"comm_bytes":{"all_gather":1.5}})",
                "entry \"all_gather\" must be a non-negative integer"},
           Case{R"({"event":"step","step":1,"comm_bytes":{"all_gather":"7"}})",
                "entry \"all_gather\" must be a non-negative integer"},
           Case{R"({"event":"step","step":1,"comm_bytes":[1]})",
                "\"comm_bytes\" must be an object"},
       }) {
    auto r = ParseProgressLine(c.line);
    ASSERT_FALSE(r.ok()) << c.line;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.line;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.error)) << c.line;
  }
}

TEST(RankExitTest, ClassifiesPerContract) {
  RankExit ok = ClassifyExit(W_EXITCODE(0, 0), "", "");
  EXPECT_EQ(ok.exit_class, v1::EXIT_CLASS_SUCCESS);
  EXPECT_EQ(ok.message, "exit code 0");
  RankExit bad = ClassifyExit(W_EXITCODE(2, 0), "", "spec: bad preset");
  EXPECT_EQ(bad.exit_class, v1::EXIT_CLASS_PERMANENT);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.message, "exit code 2: spec: bad preset");
  RankExit crash = ClassifyExit(W_EXITCODE(3, 0), "", "");
  EXPECT_EQ(crash.exit_class, v1::EXIT_CLASS_RETRYABLE);
  EXPECT_EQ(crash.message, "exit code 3");
  RankExit killed = ClassifyExit(SIGKILL, "", "boom");
  EXPECT_EQ(killed.exit_class, v1::EXIT_CLASS_RETRYABLE);
  EXPECT_EQ(killed.signal, 9);
  EXPECT_EQ(killed.exit_code, -1);
  EXPECT_EQ(killed.message, "killed by signal 9 (SIGKILL): boom");
  RankExit stopped = ClassifyExit(SIGTERM, "cancelled", "");
  EXPECT_EQ(stopped.exit_class, v1::EXIT_CLASS_STOPPED);
  EXPECT_EQ(stopped.message, "stopped (cancelled): killed by signal 15 (SIGTERM)");
  EXPECT_EQ(SignalName(SIGSEGV), "SIGSEGV");
}

v1::Assignment GoodAssignment() {
  v1::Assignment a;
  a.set_job("jobs/abc-1");
  a.set_generation(1);
  a.set_world_size(4);
  a.set_num_nodes(2);
  a.set_node_rank(1);
  a.set_rendezvous_address("127.0.0.1:7070");
  a.mutable_layout()->set_data(2);
  a.mutable_layout()->set_tensor(2);
  a.mutable_layout()->set_pipeline(1);
  a.mutable_layout()->set_micro_batch(4);
  a.mutable_layout()->set_num_micro_batches(2);
  for (int i = 0; i < 2; ++i) {
    v1::RankAssignment* r = a.add_ranks();
    r->set_rank(2 + i);
    r->set_local_rank(i);
    r->set_device_index(i);
    r->set_device_kind(v1::DEVICE_KIND_CPU);
  }
  (*a.mutable_spec()->mutable_env())["FOO"] = "bar";
  return a;
}

TEST(AssignmentValidatorTest, AcceptsAGoodOne) {
  EXPECT_TRUE(ValidateAssignment(GoodAssignment(), CpuDevices(2)).ok());
}

TEST(AssignmentValidatorTest, RefusesBadOnesNamingTheField) {
  struct Case {
    const char* field;
    std::function<void(v1::Assignment&)> mutate;
  };
  const std::vector<Case> cases = {
      {"job", [](auto& a) { a.set_job("abc"); }},
      {"job", [](auto& a) { a.set_job("jobs/../etc"); }},
      {"job", [](auto& a) { a.set_job("jobs/"); }},
      {"generation", [](auto& a) { a.set_generation(0); }},
      {"world_size", [](auto& a) { a.set_world_size(0); }},
      {"world_size", [](auto& a) { a.set_world_size(1 << 30); }},
      {"node_rank", [](auto& a) { a.set_node_rank(2); }},
      {"layout", [](auto& a) { a.mutable_layout()->set_tensor(1); }},
      {"layout", [](auto& a) { a.clear_layout(); }},
      {"ranks", [](auto& a) { a.clear_ranks(); }},
      {"ranks[1]", [](auto& a) { a.mutable_ranks(1)->set_rank(2); }},  // duplicate
      {"ranks[1]", [](auto& a) { a.mutable_ranks(1)->set_rank(4); }},  // out of range
      {"ranks[1]", [](auto& a) { a.mutable_ranks(1)->set_local_rank(0); }},
      {"ranks[1]", [](auto& a) { a.mutable_ranks(1)->set_device_index(7); }},  // unknown
      {"ranks[1]", [](auto& a) { a.mutable_ranks(1)->set_device_index(0); }},  // twice
      {"ranks[1]", [](auto& a) { a.mutable_ranks(1)->set_device_kind(v1::DEVICE_KIND_GPU); }},
      {"ranks[0]",
       [](auto& a) { a.mutable_ranks(0)->set_device_kind(v1::DEVICE_KIND_UNSPECIFIED); }},
      {"spec.env", [](auto& a) { (*a.mutable_spec()->mutable_env())["LOOM_RANK"] = "9"; }},
      {"spec.env", [](auto& a) { (*a.mutable_spec()->mutable_env())["A=B"] = "9"; }},
      {"spec.env", [](auto& a) { (*a.mutable_spec()->mutable_env())["1X"] = "9"; }},
  };
  for (const Case& c : cases) {
    v1::Assignment a = GoodAssignment();
    c.mutate(a);
    absl::Status st = ValidateAssignment(a, CpuDevices(2));
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << c.field;
    EXPECT_THAT(std::string(st.message()), HasSubstr(std::string("assignment.") + c.field)) << st;
  }
}

TEST(RankEnvironmentTest, HasExactlyTheContractVariablesPlusSpecEnv) {
  const v1::Assignment a = GoodAssignment();
  RankPaths paths{"/w/jobs/abc-1", "/w/jobs/abc-1/spec.json", "/w/jobs/abc-1/checkpoints"};
  std::map<std::string, std::string> env = BuildRankEnvironment(a, a.ranks(1), paths);
  const std::map<std::string, std::string> expected = {
      {"FOO", "bar"},
      {"LOOM_JOB", "jobs/abc-1"},
      {"LOOM_JOB_GENERATION", "1"},
      {"LOOM_RANK", "3"},
      {"LOOM_WORLD_SIZE", "4"},
      {"LOOM_LOCAL_RANK", "1"},
      {"LOOM_LOCAL_WORLD_SIZE", "2"},
      {"LOOM_NODE_RANK", "1"},
      {"LOOM_NUM_NODES", "2"},
      {"LOOM_DEVICE", "cpu:1"},
      {"LOOM_LAYOUT", "data=2,tensor=2,pipeline=1,micro_batch=4,num_micro_batches=2"},
      {"LOOM_RENDEZVOUS", "127.0.0.1:7070"},
      {"LOOM_SPEC_FILE", "/w/jobs/abc-1/spec.json"},
      {"LOOM_CHECKPOINT_DIR", "/w/jobs/abc-1/checkpoints"},
      {"LOOM_WORK_DIR", "/w/jobs/abc-1"},
      {"LOOM_TRACE_FILE", "/w/jobs/abc-1/trace-rank-3.ring"},
      {"LOOM_PROGRESS_FD", "3"},
      {"LOOM_FENCE_FD", "5"},
      {"LOOM_FENCE_TIMEOUT_MS", "30000"},
  };
  EXPECT_EQ(env, expected);
}

TEST(RankEnvironmentTest, LayoutCarriesStagesScheduleAndZeroWhenSet) {
  v1::Assignment a = GoodAssignment();
  a.mutable_layout()->add_blocks_per_stage(3);
  a.mutable_layout()->add_blocks_per_stage(1);
  a.mutable_layout()->set_schedule("gpipe");
  a.mutable_layout()->set_zero1(true);
  RankPaths paths{"/w/jobs/abc-1", "/w/jobs/abc-1/spec.json", "/w/jobs/abc-1/checkpoints"};
  std::map<std::string, std::string> env = BuildRankEnvironment(a, a.ranks(1), paths);
  EXPECT_EQ(env["LOOM_LAYOUT"],
            "data=2,tensor=2,pipeline=1,micro_batch=4,num_micro_batches=2,blocks=3/1,"
            "schedule=gpipe,zero1=1");
}

TEST(RankEnvironmentTest, InheritsOnlyListedNames) {
  auto env = InheritedEnvironment(
      {"PATH=/bin", "NCCL_DEBUG=INFO", "SECRET=x", "LOOM_RANK=1", "PATHX=1", "broken"},
      {"PATH", "NCCL_*", "LOOM_*"});
  const std::map<std::string, std::string> expected = {{"NCCL_DEBUG", "INFO"}, {"PATH", "/bin"}};
  EXPECT_EQ(env, expected);
}

TEST(RankEnvironmentTest, CpuDevicesShareTheNodesCores) {
  EXPECT_EQ(CpuThreadsPerDevice(16, 1), 16);
  EXPECT_EQ(CpuThreadsPerDevice(16, 2), 8);
  EXPECT_EQ(CpuThreadsPerDevice(16, 3), 5);  // a core left over rather than one too many
  EXPECT_EQ(CpuThreadsPerDevice(2, 8), 1);   // more devices than cores: one thread each
  EXPECT_EQ(CpuThreadsPerDevice(0, 0), 1);
  EXPECT_EQ(CpuThreadsPerDevice(-4, -1), 1);

  std::map<std::string, std::string> env = {{"PATH", "/bin"}};
  DefaultCpuThreads(4, &env);
  const std::map<std::string, std::string> expected = {
      {"OMP_NUM_THREADS", "4"}, {"OPENBLAS_NUM_THREADS", "4"}, {"PATH", "/bin"}};
  EXPECT_EQ(env, expected);
  // The job's env or the worker's own environment chose: theirs stays.
  env = {{"OMP_NUM_THREADS", "1"}};
  DefaultCpuThreads(4, &env);
  EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(env["OPENBLAS_NUM_THREADS"], "4");
}

TEST(NodeIdentityTest, SanitizesHostnames) {
  EXPECT_EQ(SanitizeNodeId("GPU-Node_01.Rack2"), "gpu-node-01-rack2");
  EXPECT_EQ(SanitizeNodeId("--x--"), "x");
  EXPECT_EQ(SanitizeNodeId("___"), "node");
  EXPECT_EQ(SanitizeNodeId(std::string(100, 'a')).size(), 63u);
  EXPECT_TRUE(IsValidNodeId(SanitizeNodeId(Hostname())));
  EXPECT_FALSE(IsValidNodeId("-a"));
  EXPECT_FALSE(IsValidNodeId("A"));
  EXPECT_FALSE(IsValidNodeId(""));
  auto cpus = CpuDevices(3);
  ASSERT_EQ(cpus.size(), 3u);
  EXPECT_EQ(cpus[2].index(), 2);
  EXPECT_EQ(cpus[2].kind(), v1::DEVICE_KIND_CPU);
  EXPECT_GT(cpus[0].memory_bytes(), 0u);
}

TEST(NodeMetricsTest, ExportsTheNodeSeries) {
  metrics::Registry registry;
  SupervisorStats stats;
  stats.launches = 5;
  stats.exits_success = 2;
  stats.exits_stopped = 3;
  stats.running_ranks = 1;
  bool connected = true;
  NodeMetrics node(&registry, CpuDevices(2), {[&] { return stats; }, [&] { return connected; }});
  std::string text = registry.Serialize();
  EXPECT_THAT(text, HasSubstr("loom_node_devices{kind=\"cpu\"} 2"));
  EXPECT_THAT(text, HasSubstr("loom_node_devices{kind=\"gpu\"} 0"));
  EXPECT_THAT(text, HasSubstr("loom_node_running_ranks 1"));
  EXPECT_THAT(text, HasSubstr("loom_worker_launches_total 5"));
  EXPECT_THAT(text, HasSubstr("loom_worker_rank_exits_total{reason=\"stopped\"} 3"));
  EXPECT_THAT(text, HasSubstr("loom_worker_rank_exits_total{reason=\"retryable\"} 0"));
  EXPECT_THAT(text, HasSubstr("loom_worker_session_connected 1"));
  stats.launches = 7;
  connected = false;
  text = registry.Serialize();
  EXPECT_THAT(text, HasSubstr("loom_worker_launches_total 7"));
  EXPECT_THAT(text, HasSubstr("loom_worker_session_connected 0"));
}

}  // namespace
}  // namespace loom::worker
