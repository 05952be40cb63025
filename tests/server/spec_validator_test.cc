// Job spec validation: one table row per rule (a bad spec → its code and a message naming the
// field and the fix), then the defaults and the resolved layout.
#include "server/jobs/spec_validator.h"

#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "server/jobs/model_presets.h"
#include "tests/server/store_test_util.h"

namespace loom::jobs {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;

ClusterCapacity Cluster(int gpus, int cpus, int nodes) {
  ClusterCapacity capacity;
  capacity.gpu = {gpus, gpus};
  capacity.cpu = {cpus, cpus};
  capacity.ready_nodes = nodes;
  return capacity;
}

// A valid GPU spec: gpt2-124m on 8 GPUs with a data file.
v1::JobSpec GpuSpec() {
  v1::JobSpec spec;
  spec.set_name("demo");
  spec.mutable_model()->set_preset("gpt2-124m");
  spec.mutable_data()->set_path("/data/train.bin");
  spec.mutable_train()->set_steps(100);
  spec.mutable_resources()->set_gpus(8);
  return spec;
}

// A valid CPU spec: the tiny model on 4 CPU devices with the builtin corpus.
v1::JobSpec CpuSpec() {
  v1::JobSpec spec;
  spec.mutable_model()->set_preset("tiny");
  spec.mutable_data()->set_builtin("tiny-corpus");
  spec.mutable_train()->set_steps(10);
  spec.mutable_resources()->set_cpu_devices(4);
  return spec;
}

v1::JobSpec Explicit(v1::JobSpec spec, int data, int tensor, int pipeline) {
  spec.mutable_parallelism()->set_data(data);
  spec.mutable_parallelism()->set_tensor(tensor);
  spec.mutable_parallelism()->set_pipeline(pipeline);
  return spec;
}

struct BadSpecCase {
  std::string test_name;
  std::function<v1::JobSpec()> spec;
  absl::StatusCode code;
  std::vector<std::string> message_contains;  // the first is always the field path
};

// The operator's roots: data under /data, checkpoints under /shared/ckpt.
const SpecPolicy& Policy() {
  static const auto* const policy = new SpecPolicy{{"/data"}, {"/shared/ckpt"}};
  return *policy;
}

class BadSpecTest : public ::testing::TestWithParam<BadSpecCase> {};

TEST_P(BadSpecTest, IsRejectedWithTheFieldAndTheFix) {
  const BadSpecCase& c = GetParam();
  auto result = ValidateJobSpec(c.spec(), Cluster(16, 8, 2), Policy());
  ASSERT_FALSE(result.ok()) << "accepted: " << c.spec().ShortDebugString();
  EXPECT_EQ(result.status().code(), c.code) << result.status();
  for (const std::string& part : c.message_contains) {
    EXPECT_THAT(std::string(result.status().message()), HasSubstr(part));
  }
}

using Code = absl::StatusCode;
constexpr Code kInvalid = Code::kInvalidArgument;
constexpr Code kPrecondition = Code::kFailedPrecondition;

template <typename F>
std::function<v1::JobSpec()> Gpu(F edit) {
  return [edit] {
    v1::JobSpec spec = GpuSpec();
    edit(spec);
    return spec;
  };
}
template <typename F>
std::function<v1::JobSpec()> Cpu(F edit) {
  return [edit] {
    v1::JobSpec spec = CpuSpec();
    edit(spec);
    return spec;
  };
}

const std::vector<BadSpecCase>& BadSpecs() {
  static const auto* const cases = new std::vector<BadSpecCase>{
      // name
      {"NameUppercase",
       Gpu([](auto& s) { s.set_name("Demo"); }),
       kInvalid,
       {"spec.name", "a-z, 0-9"}},
      {"NameTooLong",
       Gpu([](auto& s) { s.set_name(std::string(64, 'a')); }),
       kInvalid,
       {"spec.name", "63"}},
      {"NameWithSlash", Gpu([](auto& s) { s.set_name("a/b"); }), kInvalid, {"spec.name"}},
      // rebalance (the doctor's closed loop)
      {"RebalanceModeUnknown",
       Gpu([](auto& s) { s.mutable_rebalance()->set_mode("always"); }),
       kInvalid,
       {"spec.rebalance.mode", "off, suggest, auto"}},
      {"RebalanceAutoWithoutCheckpoints",
       Gpu([](auto& s) { s.mutable_rebalance()->set_mode("auto"); }),
       kInvalid,
       {"spec.rebalance.mode", "checkpoint.every_steps"}},
      // resources
      {"ZeroDevices",
       Gpu([](auto& s) { s.mutable_resources()->set_gpus(0); }),
       kInvalid,
       {"spec.resources", "spec.resources.gpus", "> 0"}},
      {"NegativeGpus",
       Gpu([](auto& s) { s.mutable_resources()->set_gpus(-2); }),
       kInvalid,
       {"spec.resources.gpus", "-2 must be > 0"}},
      {"NegativeCpuDevices",
       Cpu([](auto& s) { s.mutable_resources()->set_cpu_devices(-1); }),
       kInvalid,
       {"spec.resources.cpu_devices", "-1 must be > 0"}},
      {"BothDeviceKinds",
       Gpu([](auto& s) { s.mutable_resources()->set_cpu_devices(2); }),
       kInvalid,
       {"spec.resources", "exactly one"}},
      {"MoreCpuDevicesThanTheCluster",
       Cpu([](auto& s) { s.mutable_resources()->set_cpu_devices(9); }),
       kPrecondition,
       {"spec.resources.cpu_devices: 9 requested but the cluster has 8 CPU devices on 2 ready "
        "nodes; ask for at most 8 or add nodes"}},
      {"MoreGpusThanTheCluster",
       Gpu([](auto& s) { s.mutable_resources()->set_gpus(32); }),
       kPrecondition,
       {"spec.resources.gpus", "32 requested", "16 GPUs", "at most 16"}},
      // model
      {"UnknownPreset",
       Gpu([](auto& s) { s.mutable_model()->set_preset("gpt5"); }),
       kInvalid,
       {"spec.model.preset", "\"gpt5\"",
        "tiny, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b"}},
      {"PresetWithConflictingDimension",
       Gpu([](auto& s) { s.mutable_model()->set_hidden(512); }),
       kInvalid,
       {"spec.model.hidden", "conflicts with preset gpt2-124m"}},
      {"NoModel",
       Gpu([](auto& s) { s.clear_model(); }),
       kInvalid,
       {"spec.model", "preset", "layers, hidden, heads, seq_len"}},
      {"ExplicitDimsMissingOne",
       Gpu([](auto& s) {
         s.mutable_model()->Clear();
         s.mutable_model()->set_layers(2);
         s.mutable_model()->set_hidden(64);
         s.mutable_model()->set_heads(4);
         s.mutable_model()->set_seq_len(64);
       }),
       kInvalid,
       {"spec.model.vocab", "all five"}},
      {"ExplicitDimNegative",
       Gpu([](auto& s) {
         s.mutable_model()->Clear();
         s.mutable_model()->set_layers(-2);
         s.mutable_model()->set_hidden(64);
         s.mutable_model()->set_heads(4);
         s.mutable_model()->set_seq_len(64);
         s.mutable_model()->set_vocab(256);
       }),
       kInvalid,
       {"spec.model.layers", "-2"}},
      {"HeadsDoNotDivideHidden",
       Gpu([](auto& s) {
         s.mutable_model()->Clear();
         s.mutable_model()->set_layers(2);
         s.mutable_model()->set_hidden(100);
         s.mutable_model()->set_heads(3);
         s.mutable_model()->set_seq_len(64);
         s.mutable_model()->set_vocab(256);
       }),
       kInvalid,
       {"spec.model.heads", "does not divide", "1, 2, 4, 5"}},
      // data
      {"NoData",
       Gpu([](auto& s) { s.clear_data(); }),
       kInvalid,
       {"spec.data", "spec.data.path", "tiny-corpus"}},
      {"BothDataSources",
       Gpu([](auto& s) { s.mutable_data()->set_builtin("tiny-corpus"); }),
       kInvalid,
       {"spec.data", "not both"}},
      {"UnknownBuiltin",
       Cpu([](auto& s) { s.mutable_data()->set_builtin("big-corpus"); }),
       kInvalid,
       {"spec.data.builtin", "\"big-corpus\"", "tiny-corpus"}},
      {"RelativeDataPath",
       Gpu([](auto& s) { s.mutable_data()->set_path("data/train.bin"); }),
       kInvalid,
       {"spec.data.path", "relative", "absolute"}},
      {"DataPathOutsideTheRoots",
       Gpu([](auto& s) { s.mutable_data()->set_path("/etc/shadow"); }),
       Code::kFailedPrecondition,
       {"spec.data.path", "\"/etc/shadow\" is outside", "/data", "--data-roots"}},
      {"DataPathEscapingTheRootWithDotDot",
       Gpu([](auto& s) { s.mutable_data()->set_path("/data/../etc/shadow"); }),
       kInvalid,
       {"spec.data.path", "contains \"..\""}},
      {"DataPathWithNul",
       Gpu([](auto& s) { s.mutable_data()->set_path(std::string("/data/a\0b", 9)); }),
       kInvalid,
       {"spec.data.path", "NUL"}},
      {"DataPathTooLong",
       Gpu([](auto& s) { s.mutable_data()->set_path("/data/" + std::string(1100, 'a')); }),
       kInvalid,
       {"spec.data.path", "longer than 1024", "(1106 bytes)"}},
      {"ValPathOutsideTheRoots",
       Gpu([](auto& s) { s.mutable_data()->set_val_path("/home/other/v.bin"); }),
       Code::kFailedPrecondition,
       {"spec.data.val_path", "/home/other/v.bin", "--data-roots"}},
      // train
      {"NoSteps",
       Gpu([](auto& s) { s.mutable_train()->set_steps(0); }),
       kInvalid,
       {"spec.train.steps", "> 0"}},
      {"StepsAbove2To53",
       Gpu([](auto& s) { s.mutable_train()->set_steps(std::numeric_limits<int64_t>::max()); }),
       kInvalid,
       {"spec.train.steps", "9223372036854775807", "2^53"}},
      {"GlobalBatchTokensAbove2To53",
       Gpu([](auto& s) { s.mutable_train()->set_global_batch_tokens((int64_t{1} << 53) + 1); }),
       kInvalid,
       {"spec.train.global_batch_tokens", "2^53"}},
      {"CheckpointEveryAbove2To53",
       Gpu([](auto& s) { s.mutable_checkpoint()->set_every_steps((int64_t{1} << 53) + 1); }),
       kInvalid,
       {"spec.checkpoint.every_steps", "2^53"}},
      {"LrExplicitZero",
       Gpu([](auto& s) { s.mutable_train()->set_lr(0); }),
       kInvalid,
       {"spec.train.lr", "0 must be", "> 0", "leave it out"}},
      {"CheckpointDirOutsideTheRoots",
       Gpu([](auto& s) { s.mutable_checkpoint()->set_dir("/var/lib/other-job"); }),
       Code::kFailedPrecondition,
       {"spec.checkpoint.dir", "/var/lib/other-job", "/shared/ckpt", "--checkpoint-roots"}},
      {"CheckpointDirWithDotDot",
       Gpu([](auto& s) { s.mutable_checkpoint()->set_dir("/shared/ckpt/../../etc"); }),
       kInvalid,
       {"spec.checkpoint.dir", "\"..\""}},
      {"EnvLdPreload",
       Gpu([](auto& s) { (*s.mutable_env())["LD_PRELOAD"] = "/tmp/evil.so"; }),
       kInvalid,
       {"spec.env[\"LD_PRELOAD\"]", "dynamic loader", "remove it"}},
      {"EnvPath",
       Gpu([](auto& s) { (*s.mutable_env())["PATH"] = "/tmp"; }),
       kInvalid,
       {"spec.env[\"PATH\"]"}},
      {"EnvLdLibraryPath",
       Gpu([](auto& s) { (*s.mutable_env())["LD_LIBRARY_PATH"] = "/tmp"; }),
       kInvalid,
       {"spec.env[\"LD_LIBRARY_PATH\"]"}},
      {"EnvNulInValue",
       Gpu([](auto& s) { (*s.mutable_env())["X"] = std::string("a\0b", 3); }),
       kInvalid,
       {"spec.env[\"X\"]", "NUL"}},
      {"EchoedInputIsTruncated",
       Gpu([](auto& s) { s.mutable_model()->set_preset(std::string(5000, 'q')); }),
       kInvalid,
       {"spec.model.preset", "...\" (5000 bytes)"}},
      {"NegativeSteps",
       Gpu([](auto& s) { s.mutable_train()->set_steps(-5); }),
       kInvalid,
       {"spec.train.steps", "-5"}},
      {"NegativeLr",
       Gpu([](auto& s) { s.mutable_train()->set_lr(-0.1); }),
       kInvalid,
       {"spec.train.lr", "> 0"}},
      {"NanLr",
       Gpu([](auto& s) { s.mutable_train()->set_lr(std::numeric_limits<double>::quiet_NaN()); }),
       kInvalid,
       {"spec.train.lr", "finite"}},
      {"InfiniteLr",
       Gpu([](auto& s) { s.mutable_train()->set_lr(std::numeric_limits<double>::infinity()); }),
       kInvalid,
       {"spec.train.lr", "finite"}},
      {"UnknownAttention",
       Gpu([](auto& s) { s.mutable_train()->set_attention("flash"); }),
       kInvalid,
       {"spec.train.attention", "auto", "fused", "unfused"}},
      {"ZeroBucketSize",
       Gpu([](auto& s) { s.mutable_parallelism()->set_dp_bucket_mb(0); }),
       kInvalid,
       {"spec.parallelism.dp_bucket_mb", "(0, 1024]"}},
      {"NanBucketSize",
       Gpu([](auto& s) {
         s.mutable_parallelism()->set_dp_bucket_mb(std::numeric_limits<double>::quiet_NaN());
       }),
       kInvalid,
       {"spec.parallelism.dp_bucket_mb", "(0, 1024]"}},
      {"HugeBucketSize",
       Gpu([](auto& s) { s.mutable_parallelism()->set_dp_bucket_mb(4096); }),
       kInvalid,
       {"spec.parallelism.dp_bucket_mb", "4096"}},
      {"UnknownPrecision",
       Gpu([](auto& s) { s.mutable_train()->set_precision("fp16"); }),
       kInvalid,
       {"spec.train.precision", "fp32 or bf16"}},
      {"Bf16OnCpu",
       Cpu([](auto& s) { s.mutable_train()->set_precision("bf16"); }),
       kInvalid,
       {"spec.train.precision", "bf16 needs GPUs", "fp32"}},
      {"TrainSeqLenAboveModel",
       Gpu([](auto& s) { s.mutable_train()->set_seq_len(2048); }),
       kInvalid,
       {"spec.train.seq_len", "2048", "1024"}},
      {"NegativeTrainSeqLen",
       Gpu([](auto& s) { s.mutable_train()->set_seq_len(-1); }),
       kInvalid,
       {"spec.train.seq_len"}},
      {"NegativeWarmup",
       Gpu([](auto& s) { s.mutable_train()->set_warmup_steps(-1); }),
       kInvalid,
       {"spec.train.warmup_steps", ">= 0"}},
      {"MinLrRatioAboveOne",
       Gpu([](auto& s) { s.mutable_train()->set_min_lr_ratio(1.5); }),
       kInvalid,
       {"spec.train.min_lr_ratio", "[0, 1]"}},
      {"NegativeWeightDecay",
       Gpu([](auto& s) { s.mutable_train()->set_weight_decay(-1); }),
       kInvalid,
       {"spec.train.weight_decay", ">= 0"}},
      {"NegativeGradClip",
       Gpu([](auto& s) { s.mutable_train()->set_grad_clip(-1); }),
       kInvalid,
       {"spec.train.grad_clip"}},
      {"NegativeEvalEvery",
       Gpu([](auto& s) { s.mutable_train()->set_eval_every(-10); }),
       kInvalid,
       {"spec.train.eval_every"}},
      {"NegativeGlobalBatch",
       Gpu([](auto& s) { s.mutable_train()->set_global_batch_tokens(-8); }),
       kInvalid,
       {"spec.train.global_batch_tokens", ">= 0"}},
      // parallelism
      {"ProductDiffersFromDevices",
       [] { return Explicit(GpuSpec(), 2, 2, 1); },
       kInvalid,
       {"spec.parallelism", "2 × 2 × 1 = 4", "spec.resources.gpus is 8"}},
      {"TensorDoesNotDivideHeads",
       [] { return Explicit(GpuSpec(), 1, 8, 1); },
       kInvalid,
       {"spec.parallelism.tensor", "8 does not divide the model's 12 heads", "1, 2, 3, 4, 6, 12"}},
      {"PipelineAboveLayers",
       [] {
         v1::JobSpec spec = Explicit(CpuSpec(), 1, 1, 4);  // tiny has 2 layers
         return spec;
       },
       kInvalid,
       {"spec.parallelism.pipeline", "exceeds the model's 2 layers"}},
      {"TensorTimesPipelineDoesNotDivideDevices",
       Gpu([](auto& s) { s.mutable_parallelism()->set_tensor(3); }),
       kInvalid,
       {"spec.parallelism", "tensor × pipeline = 3 does not divide"}},
      {"AutoAndExplicit",
       Gpu([](auto& s) {
         s.mutable_parallelism()->mutable_auto_();
         s.mutable_parallelism()->set_data(8);
       }),
       kInvalid,
       {"spec.parallelism", "either auto or explicit"}},
      {"NegativeData",
       Gpu([](auto& s) { s.mutable_parallelism()->set_data(-8); }),
       kInvalid,
       {"spec.parallelism.data", "-8"}},
      {"UnknownSchedule",
       Gpu([](auto& s) { s.mutable_parallelism()->set_schedule("zigzag"); }),
       kInvalid,
       {"spec.parallelism.schedule", "\"zigzag\"", "1f1b or gpipe"}},
      {"BlocksSkipABlock",
       [] {
         v1::JobSpec spec = Explicit(GpuSpec(), 4, 1, 2);  // gpt2-124m: 12 layers
         spec.mutable_parallelism()->add_blocks_per_stage(6);
         spec.mutable_parallelism()->add_blocks_per_stage(5);
         return spec;
       },
       kInvalid,
       {"spec.parallelism.blocks_per_stage", "[6, 5]", "summing to the model's 12 layers"}},
      {"BlocksRepeatABlock",
       [] {
         v1::JobSpec spec = Explicit(GpuSpec(), 4, 1, 2);
         spec.mutable_parallelism()->add_blocks_per_stage(7);
         spec.mutable_parallelism()->add_blocks_per_stage(6);
         return spec;
       },
       kInvalid,
       {"spec.parallelism.blocks_per_stage", "[7, 6]"}},
      {"BlocksCountDiffersFromStages",
       [] {
         v1::JobSpec spec = Explicit(GpuSpec(), 4, 1, 2);
         for (int b : {4, 4, 4}) spec.mutable_parallelism()->add_blocks_per_stage(b);
         return spec;
       },
       kInvalid,
       {"spec.parallelism.blocks_per_stage", "one count per pipeline stage (2)"}},
      {"EmptyStage",
       [] {
         v1::JobSpec spec = Explicit(GpuSpec(), 4, 1, 2);
         for (int b : {12, 0}) spec.mutable_parallelism()->add_blocks_per_stage(b);
         return spec;
       },
       kInvalid,
       {"spec.parallelism.blocks_per_stage", "at least one block"}},
      {"NegativeMicroBatch",
       Gpu([](auto& s) { s.mutable_parallelism()->set_micro_batch(-1); }),
       kInvalid,
       {"spec.parallelism.micro_batch"}},
      // batch
      {"GlobalBatchNotAMultiple",
       Gpu([](auto& s) { s.mutable_train()->set_global_batch_tokens(100000); }),
       kInvalid,
       {"spec.train.global_batch_tokens", "1024 × 8 = 8192", "use 98304 or 106496"}},
      {"GlobalBatchBelowOneSequencePerRank",
       Gpu([](auto& s) { s.mutable_train()->set_global_batch_tokens(1024); }),
       kInvalid,
       {"spec.train.global_batch_tokens", "use 8192"}},
      {"GlobalBatchHuge",
       Gpu([](auto& s) { s.mutable_train()->set_global_batch_tokens(int64_t{1024} << 30); }),
       kInvalid,
       {"spec.train.global_batch_tokens", "at most"}},
      {"MicroBatchDoesNotDivide",
       Gpu([](auto& s) {
         s.mutable_train()->set_global_batch_tokens(1024 * 8 * 12);
         s.mutable_parallelism()->set_micro_batch(5);
       }),
       kInvalid,
       {"spec.parallelism.micro_batch", "12 sequences", "1, 2, 3, 4, 6, 12"}},
      // checkpoint, restart, priority
      {"NegativeCheckpointEvery",
       Gpu([](auto& s) { s.mutable_checkpoint()->set_every_steps(-1); }),
       kInvalid,
       {"spec.checkpoint.every_steps"}},
      {"RelativeCheckpointDir",
       Gpu([](auto& s) { s.mutable_checkpoint()->set_dir("ckpt"); }),
       kInvalid,
       {"spec.checkpoint.dir", "absolute"}},
      {"TooManyRestarts",
       Gpu([](auto& s) { s.mutable_restart()->set_max_restarts(101); }),
       kInvalid,
       {"spec.restart.max_restarts", "[0, 100]"}},
      {"NegativeRestarts",
       Gpu([](auto& s) { s.mutable_restart()->set_max_restarts(-1); }),
       kInvalid,
       {"spec.restart.max_restarts"}},
      {"BackoffTooLong",
       Gpu([](auto& s) { s.mutable_restart()->set_backoff_seconds(3601); }),
       kInvalid,
       {"spec.restart.backoff_seconds", "[0, 3600]"}},
      {"NegativeBackoff",
       Gpu([](auto& s) { s.mutable_restart()->set_backoff_seconds(-1); }),
       kInvalid,
       {"spec.restart.backoff_seconds"}},
      {"PriorityTooHigh",
       Gpu([](auto& s) { s.set_priority(1001); }),
       kInvalid,
       {"spec.priority", "[-1000, 1000]"}},
      {"PriorityTooLow", Gpu([](auto& s) { s.set_priority(-1001); }), kInvalid, {"spec.priority"}},
      // env
      {"EnvLowercaseKey",
       Gpu([](auto& s) { (*s.mutable_env())["path"] = "x"; }),
       kInvalid,
       {"spec.env[\"path\"]", "[A-Z_][A-Z0-9_]*"}},
      {"EnvKeyStartsWithDigit",
       Gpu([](auto& s) { (*s.mutable_env())["1X"] = "x"; }),
       kInvalid,
       {"spec.env[\"1X\"]"}},
      {"EnvLoomPrefix",
       Gpu([](auto& s) { (*s.mutable_env())["LOOM_RANK"] = "3"; }),
       kInvalid,
       {"spec.env[\"LOOM_RANK\"]", "LOOM_"}},
      {"EnvValueTooLong",
       Gpu([](auto& s) { (*s.mutable_env())["BIG"] = std::string(4097, 'x'); }),
       kInvalid,
       {"spec.env[\"BIG\"]", "4097 bytes", "4096"}},
      {"EnvTooManyEntries",
       Gpu(
           [](auto& s) {
             for (int i = 0; i < 65; ++i) (*s.mutable_env())["V" + std::to_string(i)] = "x";
           }),
       kInvalid,
       {"spec.env", "65 entries", "64"}},
  };
  return *cases;
}

INSTANTIATE_TEST_SUITE_P(Rules, BadSpecTest, ::testing::ValuesIn(BadSpecs()),
                         [](const auto& info) { return info.param.test_name; });

TEST(SpecValidatorTest, AGpuSpecGetsEveryDefault) {
  auto result = ValidateJobSpec(GpuSpec(), Cluster(16, 0, 2), Policy());
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::JobSpec& spec = result->spec;
  EXPECT_EQ(result->device_kind, v1::DEVICE_KIND_GPU);
  EXPECT_EQ(result->devices, 8);
  EXPECT_EQ(spec.name(), "demo");
  EXPECT_EQ(spec.model().preset(), "gpt2-124m");
  EXPECT_EQ(spec.model().layers(), 12);
  EXPECT_EQ(spec.model().hidden(), 768);
  EXPECT_EQ(spec.model().heads(), 12);
  EXPECT_EQ(spec.model().seq_len(), 1024);
  EXPECT_EQ(spec.model().vocab(), 50257);
  EXPECT_EQ(spec.train().seq_len(), 1024);
  EXPECT_EQ(spec.train().global_batch_tokens(), 1024 * 8 * 8);
  EXPECT_DOUBLE_EQ(spec.train().lr(), 6e-4);
  EXPECT_EQ(spec.train().precision(), "bf16");
  EXPECT_EQ(spec.train().seed(), 1337);
  EXPECT_DOUBLE_EQ(spec.train().min_lr_ratio(), 0.1);
  EXPECT_DOUBLE_EQ(spec.train().weight_decay(), 0.1);
  EXPECT_DOUBLE_EQ(spec.train().grad_clip(), 1.0);
  EXPECT_DOUBLE_EQ(spec.restart().backoff_seconds(), 1.0);
  EXPECT_EQ(spec.restart().max_restarts(), 0);
  EXPECT_EQ(spec.parallelism().micro_batch(), 8);
  EXPECT_EQ(spec.parallelism().data(), 0) << "auto leaves the sizes to the layout";
  const v1::Layout& layout = result->layout;
  EXPECT_EQ(layout.data(), 8);
  EXPECT_EQ(layout.tensor(), 1);
  EXPECT_EQ(layout.pipeline(), 1);
  EXPECT_EQ(layout.micro_batch(), 8);
  EXPECT_EQ(layout.num_micro_batches(), 1);
}

TEST(SpecValidatorTest, ACpuSpecDefaultsToFp32AndTheNameJob) {
  auto result = ValidateJobSpec(CpuSpec(), Cluster(0, 4, 1), Policy());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->spec.name(), "job");
  EXPECT_EQ(result->spec.train().precision(), "fp32");
  EXPECT_EQ(result->device_kind, v1::DEVICE_KIND_CPU);
  EXPECT_EQ(result->devices, 4);
  EXPECT_EQ(result->spec.train().global_batch_tokens(), 64 * 4 * 8);
}

TEST(SpecValidatorTest, ExplicitLayoutIsKeptAndMissingDataSizeIsInferred) {
  v1::JobSpec spec = GpuSpec();
  spec.mutable_parallelism()->set_tensor(2);
  spec.mutable_parallelism()->set_pipeline(2);
  spec.mutable_train()->set_global_batch_tokens(1024 * 2 * 12);  // 12 sequences per dp rank
  auto result = ValidateJobSpec(spec, Cluster(8, 0, 1), Policy());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->layout.data(), 2);
  EXPECT_EQ(result->layout.tensor(), 2);
  EXPECT_EQ(result->layout.pipeline(), 2);
  EXPECT_EQ(result->spec.parallelism().data(), 2);
  // The default micro-batch is the largest divisor of 12 that is at most 8.
  EXPECT_EQ(result->layout.micro_batch(), 6);
  EXPECT_EQ(result->layout.num_micro_batches(), 2);
}

TEST(SpecValidatorTest, StageBoundariesScheduleAndZeroReachTheLayout) {
  v1::JobSpec spec = Explicit(GpuSpec(), 4, 1, 2);  // gpt2-124m: 12 layers
  spec.mutable_parallelism()->add_blocks_per_stage(7);
  spec.mutable_parallelism()->add_blocks_per_stage(5);
  spec.mutable_parallelism()->set_schedule("gpipe");
  spec.mutable_parallelism()->set_zero1(true);
  auto result = ValidateJobSpec(spec, Cluster(8, 0, 1), Policy());
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->layout.blocks_per_stage_size(), 2);
  EXPECT_EQ(result->layout.blocks_per_stage(0), 7);
  EXPECT_EQ(result->layout.blocks_per_stage(1), 5);
  EXPECT_EQ(result->layout.schedule(), "gpipe");
  EXPECT_TRUE(result->layout.zero1());
}

TEST(SpecValidatorTest, MicroBatchDefaultIsTheLargestDivisorUpToEight) {
  const std::vector<std::pair<int, int>> per_rank_to_micro = {
      {1, 1}, {5, 5}, {7, 7}, {8, 8}, {9, 3}, {10, 5}, {11, 1}, {16, 8}, {21, 7}};
  for (const auto& [per_rank, micro] : per_rank_to_micro) {
    v1::JobSpec spec = CpuSpec();  // seq_len 64, data 4
    spec.mutable_train()->set_global_batch_tokens(int64_t{64} * 4 * per_rank);
    auto result = ValidateJobSpec(spec, Cluster(0, 4, 1), Policy());
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->layout.micro_batch(), micro) << per_rank << " sequences per rank";
    EXPECT_EQ(result->layout.micro_batch() * result->layout.num_micro_batches(), per_rank);
  }
}

TEST(SpecValidatorTest, DefaultGlobalBatchFitsAGivenMicroBatch) {
  v1::JobSpec spec = CpuSpec();
  spec.mutable_parallelism()->set_micro_batch(3);
  auto result = ValidateJobSpec(spec, Cluster(0, 4, 1), Policy());
  ASSERT_TRUE(result.ok()) << result.status();
  // 8 sequences per rank rounded up to a multiple of 3.
  EXPECT_EQ(result->spec.train().global_batch_tokens(), 64 * 4 * 9);
  EXPECT_EQ(result->layout.micro_batch(), 3);
  EXPECT_EQ(result->layout.num_micro_batches(), 3);
}

TEST(SpecValidatorTest, ShorterTrainingSequencesShapeTheBatch) {
  v1::JobSpec spec = GpuSpec();
  spec.mutable_train()->set_seq_len(256);
  auto result = ValidateJobSpec(spec, Cluster(8, 0, 1), Policy());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->spec.train().global_batch_tokens(), 256 * 8 * 8);
}

TEST(SpecValidatorTest, ExplicitDimensionsAreAccepted) {
  v1::JobSpec spec = CpuSpec();
  spec.mutable_model()->Clear();
  spec.mutable_model()->set_layers(3);
  spec.mutable_model()->set_hidden(96);
  spec.mutable_model()->set_heads(6);
  spec.mutable_model()->set_seq_len(32);
  spec.mutable_model()->set_vocab(300);
  *spec.mutable_parallelism() = Explicit(spec, 2, 2, 1).parallelism();
  auto result = ValidateJobSpec(spec, Cluster(0, 4, 1), Policy());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->spec.train().seq_len(), 32);
  EXPECT_EQ(result->layout.tensor(), 2);
}

TEST(SpecValidatorTest, UserValuesAreKept) {
  v1::JobSpec spec = GpuSpec();
  spec.mutable_train()->set_lr(3e-4);
  spec.mutable_train()->set_seed(7);
  spec.mutable_train()->set_precision("fp32");
  spec.mutable_restart()->set_max_restarts(3);
  spec.mutable_restart()->set_backoff_seconds(2.5);
  spec.set_priority(-1000);
  (*spec.mutable_env())["HF_HOME"] = "/cache";
  (*spec.mutable_env())["_UNDER"] = "";
  spec.mutable_data()->set_val_path("/data/val.bin");
  auto result = ValidateJobSpec(spec, Cluster(8, 0, 1), Policy());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_DOUBLE_EQ(result->spec.train().lr(), 3e-4);
  EXPECT_EQ(result->spec.train().seed(), 7);
  EXPECT_EQ(result->spec.train().precision(), "fp32");
  EXPECT_EQ(result->spec.restart().max_restarts(), 3);
  EXPECT_DOUBLE_EQ(result->spec.restart().backoff_seconds(), 2.5);
  EXPECT_EQ(result->spec.env().at("HF_HOME"), "/cache");
}

TEST(SpecValidatorTest, ValidatingAValidatedSpecChangesNothing) {
  for (v1::JobSpec spec : {GpuSpec(), CpuSpec(), Explicit(GpuSpec(), 2, 2, 2)}) {
    const ClusterCapacity cluster = Cluster(8, 4, 1);
    auto first = ValidateJobSpec(spec, cluster, Policy());
    ASSERT_TRUE(first.ok()) << first.status();
    auto second = ValidateJobSpec(first->spec, cluster, Policy());
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_TRUE(MessageDifferencer::Equals(first->spec, second->spec));
    EXPECT_TRUE(MessageDifferencer::Equals(first->layout, second->layout));
  }
}

TEST(SpecValidatorTest, InvalidArgumentComesBeforeCapacity) {
  v1::JobSpec spec = GpuSpec();
  spec.mutable_resources()->set_gpus(64);  // too many for the cluster
  spec.mutable_train()->set_steps(0);      // and wrong anyway
  auto result = ValidateJobSpec(spec, Cluster(8, 0, 1), Policy());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("spec.train.steps"));
}

TEST(SpecValidatorTest, AClusterWithoutGpusSaysSo) {
  auto result = ValidateJobSpec(GpuSpec(), Cluster(0, 4, 1), Policy());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(result.status().message(),
            "spec.resources.gpus: 8 requested but the cluster has no GPUs on 1 ready node; add "
            "nodes with GPUs or ask for cpu_devices instead");
}

TEST(SpecValidatorTest, CapacityCountsOnlyReadyNodes) {
  std::vector<v1::Node> nodes = {store::testing::MakeNode("a", 3), store::testing::MakeNode("b", 5),
                                 store::testing::MakeNode("lost", 16, v1::NODE_STATE_LOST)};
  v1::Device* gpu = nodes[0].add_devices();
  gpu->set_kind(v1::DEVICE_KIND_GPU);
  gpu->set_index(0);
  const ClusterCapacity capacity = CapacityOf(nodes);
  EXPECT_EQ(capacity.ready_nodes, 2);
  EXPECT_EQ(capacity.cpu.total, 8);
  EXPECT_EQ(capacity.cpu.max_per_node, 5);
  EXPECT_EQ(capacity.gpu.total, 1);
  EXPECT_EQ(capacity.gpu.max_per_node, 1);
}

TEST(ModelPresetsTest, MatchTheRankContract) {
  ASSERT_EQ(ModelPresets().size(), 6u);
  EXPECT_EQ(ModelPresetNames(), "tiny, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b");
  const std::optional<ModelDims> xl = FindModelPreset("gpt2-1.5b");
  ASSERT_TRUE(xl.has_value());
  EXPECT_EQ(xl->layers, 48);
  EXPECT_EQ(xl->hidden, 1600);
  EXPECT_EQ(xl->heads, 25);
  EXPECT_FALSE(FindModelPreset("GPT2-124M").has_value());
  for (const ModelPreset& preset : ModelPresets()) {
    EXPECT_EQ(preset.dims.hidden % preset.dims.heads, 0) << preset.name;
  }
}

TEST(SpecValidatorTest, PathsComeBackNormalised) {
  v1::JobSpec spec = GpuSpec();
  spec.mutable_data()->set_path("/data//sub/./train.bin");
  spec.mutable_checkpoint()->set_dir("/shared/ckpt/run1/");
  auto result = ValidateJobSpec(spec, Cluster(16, 0, 2), Policy());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->spec.data().path(), "/data/sub/train.bin");
  EXPECT_EQ(result->spec.checkpoint().dir(), "/shared/ckpt/run1");
}

// Without roots loomd checks the syntax only, and never the file system: a path that does not
// exist on loomd's host is accepted (the worker checks it where it is read).
TEST(SpecValidatorTest, WithoutRootsAnyAbsolutePathIsAcceptedWithoutOpeningIt) {
  v1::JobSpec spec = GpuSpec();
  spec.mutable_data()->set_path("/no/such/dir/train.bin");
  spec.mutable_checkpoint()->set_dir("/anywhere/ckpt");
  auto result = ValidateJobSpec(spec, Cluster(16, 0, 2), SpecPolicy{});
  ASSERT_TRUE(result.ok()) << result.status();
}

// The proto documents the default global batch as 8 sequences per data-parallel rank.
TEST(SpecValidatorTest, DefaultGlobalBatchIsEightSequencesPerDataParallelRank) {
  v1::JobSpec spec = Explicit(CpuSpec(), 2, 2, 1);
  auto result = ValidateJobSpec(spec, Cluster(0, 4, 1), Policy());
  ASSERT_TRUE(result.ok()) << result.status();
  const int64_t seq_len = result->spec.train().seq_len();
  EXPECT_EQ(result->spec.train().global_batch_tokens(), seq_len * 8 * 2);
  EXPECT_EQ(result->layout.micro_batch() * result->layout.num_micro_batches(), 8);
}

TEST(SpecValidatorTest, AnAbsentLrGetsTheDefaultAndAGivenOneIsKept) {
  v1::JobSpec spec = CpuSpec();
  auto absent = ValidateJobSpec(spec, Cluster(0, 4, 1), Policy());
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_TRUE(absent->spec.train().has_lr());
  EXPECT_DOUBLE_EQ(absent->spec.train().lr(), 6e-4);
  spec.mutable_train()->set_lr(1e-9);
  auto given = ValidateJobSpec(spec, Cluster(0, 4, 1), Policy());
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_DOUBLE_EQ(given->spec.train().lr(), 1e-9);
}

}  // namespace
}  // namespace loom::jobs
