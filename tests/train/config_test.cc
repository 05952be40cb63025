// Job spec reading: the JSON and YAML readers, the spec's fields, defaults and errors, flags,
// and the rank environment.
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/train/test_util.h"
#include "worker/train/config/flags.h"
#include "worker/train/config/job_config.h"
#include "worker/train/config/json.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/config/yaml.h"
#include "worker/train/error.h"

namespace loom::train {
namespace {

using testing::ErrorOf;

using ::testing::HasSubstr;

// The message of the InputError that `fn` throws ("" when it throws none).
JobConfig FromYaml(const std::string& yaml) {
  return JobConfigFromValue(ParseYaml(yaml, "job.yaml"), "job.yaml");
}

JobConfig FromJson(const std::string& json) {
  return JobConfigFromValue(ParseJson(json, "spec.json"), "spec.json");
}

TEST(JsonTest, ParsesNestedDocumentWithEscapes) {
  Value v = ParseJson(R"({"a": [1, -2.5e3, true, null], "s": "x\"y\\n\u00e9\ud83d\ude00",
                          "o": {}})",
                      "t");
  ASSERT_TRUE(v.is_object());
  const Value* a = v.Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items.size(), 4u);
  EXPECT_EQ(a->items[1].kind, Value::Kind::kNumber);
  EXPECT_EQ(a->items[1].text, "-2.5e3");
  EXPECT_EQ(a->items[2].text, "true");
  EXPECT_EQ(a->items[3].kind, Value::Kind::kNull);
  EXPECT_EQ(v.Find("s")->text, "x\"y\\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_TRUE(v.Find("o")->is_object());
}

TEST(JsonTest, ErrorsNameLineAndColumn) {
  EXPECT_THAT(ErrorOf([] { ParseJson("{\n  \"a\": 1,\n  \"b\" 2}", "f.json"); }),
              HasSubstr("f.json:3:7"));
  EXPECT_THAT(ErrorOf([] { ParseJson("{\"a\": 1, \"a\": 2}", "f.json"); }),
              HasSubstr("duplicate key"));
  EXPECT_THAT(ErrorOf([] { ParseJson("[1, 2", "f.json"); }), HasSubstr("f.json:1:"));
  EXPECT_THAT(ErrorOf([] { ParseJson("01", "f.json"); }), HasSubstr("unexpected content"));
  EXPECT_THAT(ErrorOf([] { ParseJson("{} x", "f.json"); }), HasSubstr("unexpected content"));
}

TEST(JsonTest, WriterRoundTrips) {
  JsonObject o;
  o.Add("s", "a\"b\n").Add("d", 0.1).Add("i", int64_t{-7}).Add("b", true);
  Value v = ParseJson(o.str(), "t");
  EXPECT_EQ(v.Find("s")->text, "a\"b\n");
  EXPECT_EQ(std::stod(v.Find("d")->text), 0.1);
  EXPECT_EQ(v.Find("i")->text, "-7");
  EXPECT_EQ(v.Find("b")->text, "true");
  EXPECT_EQ(JsonNumber(1.0 / 0.0), "null");
}

TEST(YamlTest, ParsesTheDesignExample) {
  JobConfig c = FromYaml(R"(name: gpt2-small-demo
model: {preset: gpt2-124m}          # or layers/hidden/heads/seq_len/vocab
data: {path: data/train.bin}        # token file; or builtin: tiny-corpus
train: {steps: 2000, global_batch_tokens: 524288, lr: 6.0e-4, precision: bf16}
resources: {gpus: 8}
parallelism: {auto: {}}             # or {data: 2, tensor: 2, pipeline: 2, micro_batch: 4}
checkpoint: {every_steps: 200}
restart: {max_restarts: 3}
)");
  EXPECT_EQ(c.name, "gpt2-small-demo");
  EXPECT_EQ(c.preset, "gpt2-124m");
  EXPECT_EQ(c.model, (ModelDims{12, 768, 12, 1024, 50257}));
  EXPECT_EQ(c.data_path, "data/train.bin");
  EXPECT_EQ(c.steps, 2000);
  EXPECT_EQ(c.global_batch_tokens, 524288);
  EXPECT_DOUBLE_EQ(c.lr, 6.0e-4);
  EXPECT_EQ(c.precision, "bf16");
  EXPECT_EQ(c.gpus, 8);
  EXPECT_TRUE(c.parallelism_auto);
  EXPECT_EQ(c.checkpoint_every, 200);
  EXPECT_EQ(c.max_restarts, 3);
  EXPECT_EQ(c.seq_len, 1024);  // defaults to the model's
  EXPECT_EQ(c.seed, 1337u);
  EXPECT_DOUBLE_EQ(c.min_lr_ratio, 0.1);
}

TEST(YamlTest, BlockMappingsCommentsQuotesAndFlowAcrossLines) {
  Value v = ParseYaml(R"(---
# a comment line
name: "demo-1"   # trailing comment
model:
  layers: 3
  hidden: 48

  heads: 4
  seq_len: 32
  vocab: 300
data:
  builtin: 'tiny-corpus'
train: {steps: 10,
        seq_len: 16, lr: 1e-3}
env: {MY_VAR: "a # not a comment", OTHER: x:y}
)",
                      "job.yaml");
  JobConfig c = JobConfigFromValue(v, "job.yaml");
  EXPECT_EQ(c.name, "demo-1");
  EXPECT_EQ(c.model, (ModelDims{3, 48, 4, 32, 300}));
  EXPECT_EQ(c.data_builtin, "tiny-corpus");
  EXPECT_EQ(c.steps, 10);
  EXPECT_EQ(c.seq_len, 16);
  EXPECT_DOUBLE_EQ(c.lr, 1e-3);
  EXPECT_EQ(c.env.at("MY_VAR"), "a # not a comment");
  EXPECT_EQ(c.env.at("OTHER"), "x:y");
  EXPECT_EQ(c.global_batch_tokens, 16 * 8);
}

TEST(YamlTest, TypesPlainScalars) {
  Value v = ParseYaml("a: 12\nb: -1.5e-3\nc: true\nd: ~\ne: 12abc\nf:\ng: '12'\n", "t");
  EXPECT_EQ(v.Find("a")->kind, Value::Kind::kNumber);
  EXPECT_EQ(v.Find("b")->kind, Value::Kind::kNumber);
  EXPECT_EQ(v.Find("c")->kind, Value::Kind::kBool);
  EXPECT_EQ(v.Find("d")->kind, Value::Kind::kNull);
  EXPECT_EQ(v.Find("e")->kind, Value::Kind::kString);
  EXPECT_EQ(v.Find("f")->kind, Value::Kind::kNull);
  EXPECT_EQ(v.Find("g")->kind, Value::Kind::kString);
}

TEST(YamlTest, UnsupportedAndMalformedInputNamesTheLine) {
  EXPECT_THAT(ErrorOf([] { ParseYaml("a:\n  - 1\n", "j.yaml"); }),
              HasSubstr("j.yaml:2:3: block sequences"));
  EXPECT_THAT(ErrorOf([] { ParseYaml("a:\n\tb: 1\n", "j.yaml"); }), HasSubstr("tab"));
  EXPECT_THAT(ErrorOf([] { ParseYaml("a: 1\n  b: 2\n", "j.yaml"); }),
              HasSubstr("j.yaml:2:3: unexpected indentation"));
  EXPECT_THAT(ErrorOf([] { ParseYaml("a: {b: 1\n", "j.yaml"); }), HasSubstr("unterminated"));
  EXPECT_THAT(ErrorOf([] { ParseYaml("a: 1\na: 2\n", "j.yaml"); }),
              HasSubstr("j.yaml:2:1: duplicate key"));
  EXPECT_THAT(ErrorOf([] { ParseYaml("a: \"x\n", "j.yaml"); }), HasSubstr("unterminated"));
  EXPECT_THAT(ErrorOf([] { ParseYaml("a: |\n  text\n", "j.yaml"); }), HasSubstr("block scalars"));
}

TEST(SpecTest, ProtoJsonMappingWithCamelCaseStringsAndZeroDefaults) {
  // As loom-worker writes it: lowerCamelCase or proto names, int64 as strings, zeros filled in.
  // (An absent seed defaults to 1337: see ParsesTheDesignExample.)
  JobConfig c = FromJson(R"({"name": "job-7", "model": {"preset": "tiny", "layers": 0,
      "hidden": 0, "heads": 0, "seqLen": 0, "vocab": 0},
      "data": {"path": "", "builtin": "tiny-corpus", "valPath": ""},
      "train": {"steps": "200", "globalBatchTokens": "512", "precision": "",
                "seed": "0", "warmupSteps": "5", "minLrRatio": 0, "weightDecay": 0.05,
                "gradClip": 0, "evalEvery": "50", "seqLen": 32},
      "resources": {"gpus": 0, "cpuDevices": 1},
      "parallelism": {"auto": {}, "data": 0, "tensor": 0, "pipeline": 0, "microBatch": 0},
      "checkpoint": {"everySteps": "100", "dir": ""},
      "restart": {"maxRestarts": 2, "backoffSeconds": 1.5},
      "priority": 3, "env": {"HF_HOME": "/x"}, "rebalance": {"mode": "auto"}})");
  EXPECT_EQ(c.name, "job-7");
  EXPECT_EQ(c.model, *PresetDims("tiny"));
  EXPECT_EQ(c.steps, 200);
  EXPECT_EQ(c.global_batch_tokens, 512);
  EXPECT_DOUBLE_EQ(c.lr, 6e-4);    // absent (an unset optional field is not printed): default
  EXPECT_EQ(c.seed, 0u);           // explicit presence in job.proto: 0 is a seed
  EXPECT_EQ(c.precision, "fp32");  // empty means unset
  EXPECT_EQ(c.warmup_steps, 5);
  EXPECT_DOUBLE_EQ(c.min_lr_ratio, 0.0);  // zero is meaningful here
  EXPECT_DOUBLE_EQ(c.grad_clip, 0.0);     // 0 disables clipping
  EXPECT_DOUBLE_EQ(c.weight_decay, 0.05);
  EXPECT_EQ(c.eval_every, 50);
  EXPECT_EQ(c.seq_len, 32);
  EXPECT_EQ(c.cpu_devices, 1);
  EXPECT_EQ(c.checkpoint_every, 100);
  EXPECT_EQ(c.max_restarts, 2);
  EXPECT_EQ(c.priority, 3);
  EXPECT_EQ(c.env.at("HF_HOME"), "/x");
}

TEST(SpecTest, ErrorsNameTheFileAndField) {
  const std::string base = "model: {preset: tiny}\ndata: {builtin: tiny-corpus}\n";
  EXPECT_THAT(ErrorOf([&] { FromYaml(base + "train: {steps: 10, stpes: 3}\n"); }),
              HasSubstr("job.yaml: train.stpes: unknown key"));
  EXPECT_THAT(ErrorOf([&] { FromYaml(base + "train: {steps: 10}\nbogus: 1\n"); }),
              HasSubstr("job.yaml: bogus: unknown key"));
  EXPECT_THAT(ErrorOf([&] { FromYaml(base + "train: {steps: ten}\n"); }),
              HasSubstr("job.yaml: train.steps: expected an integer, got \"ten\""));
  EXPECT_THAT(ErrorOf([&] { FromYaml(base + "train: {steps: 0}\n"); }),
              HasSubstr("train.steps: expected > 0"));
  EXPECT_THAT(ErrorOf([&] { FromYaml(base + "train: {steps: 5, lr: fast}\n"); }),
              HasSubstr("train.lr: expected a finite number"));
  // An explicit 0 is not "the default" (loomd refuses it at create too).
  EXPECT_THAT(ErrorOf([&] { FromYaml(base + "train: {steps: 5, lr: 0}\n"); }),
              HasSubstr("train.lr: expected > 0"));
  EXPECT_THAT(ErrorOf([&] { FromYaml(base + "train: {steps: 5, precision: fp8}\n"); }),
              HasSubstr("train.precision"));
  EXPECT_THAT(ErrorOf([&] { FromYaml(base + "train: {steps: 5, attention: flash}\n"); }),
              HasSubstr("train.attention: expected auto, fused or unfused"));
  EXPECT_EQ(FromYaml(base + "train: {steps: 5}\n").attention, "auto");
  EXPECT_EQ(FromYaml(base + "train: {steps: 5, attention: unfused}\n").attention, "unfused");
  EXPECT_THAT(ErrorOf([&] { FromYaml(base + "train: {steps: 5}\nmodel: {preset: x}\n"); }),
              HasSubstr("duplicate key"));
  EXPECT_THAT(ErrorOf([] {
                FromYaml(
                    "model: {preset: huge}\ndata: {builtin: tiny-corpus}\n"
                    "train: {steps: 5}\n");
              }),
              HasSubstr("model.preset: unknown preset \"huge\""));
  EXPECT_THAT(ErrorOf([] { FromYaml("model: {preset: tiny}\ntrain: {steps: 5}\n"); }),
              HasSubstr("job.yaml: data: expected exactly one"));
  EXPECT_THAT(ErrorOf([] {
                FromYaml(
                    "model: {preset: tiny}\ndata: {builtin: tiny-corpus, path: a.bin}\n"
                    "train: {steps: 5}\n");
              }),
              HasSubstr("data: expected exactly one"));
  EXPECT_THAT(ErrorOf([&] { FromYaml(base + "train: {steps: 5}\nname: My_Job\n"); }),
              HasSubstr("name: expected only [a-z0-9-]"));
  EXPECT_THAT(ErrorOf([&] { FromYaml(base + "train: {steps: 5, seqLen: 8, seq_len: 8}\n"); }),
              HasSubstr("given twice"));
}

TEST(SpecTest, ImpossibleDimensionsAreRefused) {
  EXPECT_THAT(ErrorOf([] {
                FromYaml(
                    "model: {layers: 2, hidden: 64, heads: 5, seq_len: 64, vocab: 256}\n"
                    "data: {builtin: tiny-corpus}\ntrain: {steps: 5}\n");
              }),
              HasSubstr("model.heads: 5 does not divide model.hidden 64"));
  EXPECT_THAT(ErrorOf([] {
                FromYaml(
                    "model: {preset: tiny}\ndata: {builtin: tiny-corpus}\n"
                    "train: {steps: 5, seq_len: 128}\n");
              }),
              HasSubstr("train.seq_len: expected 1..64"));
  EXPECT_THAT(ErrorOf([] {
                FromYaml(
                    "model: {preset: tiny}\ndata: {builtin: tiny-corpus}\n"
                    "train: {steps: 5, seq_len: 64, global_batch_tokens: 100}\n");
              }),
              HasSubstr("train.global_batch_tokens: 100 is not a multiple"));
  EXPECT_THAT(ErrorOf([] {
                FromYaml(
                    "model: {layers: 2, hidden: 64}\ndata: {builtin: tiny-corpus}\n"
                    "train: {steps: 5}\n");
              }),
              HasSubstr("model.heads: expected > 0"));
  EXPECT_THAT(ErrorOf([] {
                FromYaml(
                    "model: {preset: tiny, vocab: 70000}\ndata: {builtin: tiny-corpus}\n"
                    "train: {steps: 5}\n");
              }),
              HasSubstr("model.vocab: expected at most 65536"));
}

TEST(LayoutTest, ParsesAndRefusesParallelismForNow) {
  Layout l = ParseLayout("data=1,tensor=1,pipeline=1,micro_batch=4,num_micro_batches=2");
  EXPECT_EQ(l.micro_batch, 4);
  EXPECT_EQ(l.num_micro_batches, 2);
  EXPECT_THAT(ErrorOf([] { ParseLayout("data=1,warp=2,micro_batch=1,num_micro_batches=1"); }),
              HasSubstr("LOOM_LAYOUT: unknown key \"warp\""));
  EXPECT_THAT(ErrorOf([] { ParseLayout("data=1,micro_batch=x,num_micro_batches=1"); }),
              HasSubstr("LOOM_LAYOUT micro_batch"));

  JobConfig c = FromYaml(
      "model: {preset: tiny}\ndata: {builtin: tiny-corpus}\n"
      "train: {steps: 5, seq_len: 32, global_batch_tokens: 256}\n");
  RankEnv env;
  env.has_layout = true;
  env.layout = ParseLayout("data=1,tensor=1,pipeline=1,micro_batch=4,num_micro_batches=2");
  BatchShape s = ResolveBatchShape(c, env);
  EXPECT_EQ(s.B, 4);
  EXPECT_EQ(s.K, 2);
  EXPECT_EQ(s.T, 32);
  EXPECT_EQ(s.tokens_per_step(), 256);

  // Data parallel: each of 2 ranks runs half the sequences; rank 1 is dp rank 1.
  env.layout = ParseLayout("data=2,tensor=1,pipeline=1,micro_batch=2,num_micro_batches=2");
  env.world_size = 2;
  env.rank = 1;
  s = ResolveBatchShape(c, env);
  EXPECT_EQ(s.B, 2);
  EXPECT_EQ(s.K, 2);
  EXPECT_EQ(s.dp_size, 2);
  EXPECT_EQ(s.dp_rank, 1);
  EXPECT_EQ(s.tokens_per_step(), 256);
  env.world_size = 4;  // the layout must cover the world
  EXPECT_THAT(ErrorOf([&] { ResolveBatchShape(c, env); }),
              HasSubstr("LOOM_LAYOUT: data*tensor*pipeline = 2 but LOOM_WORLD_SIZE = 4"));
  // Tensor fastest, then data, then pipeline: rank 3 of (dp 1, tp 2, pp 2) is tp 1 of stage 1.
  env.layout = ParseLayout("data=1,tensor=2,pipeline=2,micro_batch=4,num_micro_batches=2");
  env.rank = 3;
  s = ResolveBatchShape(c, env);
  EXPECT_EQ(s.tp_rank, 1);
  EXPECT_EQ(s.dp_rank, 0);
  EXPECT_EQ(s.pp_rank, 1);
  EXPECT_EQ(s.stage_bounds, (std::vector<int>{0, 1, 2}));
  env.world_size = 1;
  env.rank = 0;
  env.layout = ParseLayout("data=1,tensor=1,pipeline=1,micro_batch=4,num_micro_batches=1");
  EXPECT_THAT(ErrorOf([&] { ResolveBatchShape(c, env); }),
              HasSubstr("but train.global_batch_tokens = 256"));
}

// Issue 4's bad layouts, each a clear InputError (exit 2) naming LOOM_LAYOUT: a product that
// is not the world size, tp not dividing the heads, more stages than blocks, and stage blocks
// that skip or repeat a block.
TEST(LayoutTest, BadParallelLayoutsAreRefused) {
  JobConfig c = FromYaml(
      "model: {layers: 4, hidden: 64, heads: 4, seq_len: 64, vocab: 256}\n"
      "data: {builtin: tiny-corpus}\ntrain: {steps: 5, seq_len: 32, global_batch_tokens: 256}\n");
  RankEnv env;
  env.has_layout = true;
  auto error = [&](const std::string& layout, int world) {
    env.layout = ParseLayout(layout);
    env.world_size = world;
    env.rank = 0;
    return ErrorOf([&] { ResolveBatchShape(c, env); });
  };
  // A good one first, so that the others fail for their own reason.
  EXPECT_EQ(error("data=2,tensor=2,pipeline=2,micro_batch=1,num_micro_batches=4", 8), "");
  EXPECT_EQ(error("data=1,tensor=1,pipeline=2,micro_batch=1,num_micro_batches=8,blocks=3/1", 2),
            "");
  EXPECT_THAT(error("data=2,tensor=2,pipeline=2,micro_batch=1,num_micro_batches=4", 4),
              HasSubstr("data*tensor*pipeline = 8 but LOOM_WORLD_SIZE = 4"));
  EXPECT_THAT(error("data=1,tensor=3,pipeline=1,micro_batch=1,num_micro_batches=8", 3),
              HasSubstr("LOOM_LAYOUT tensor: 3 does not divide the model's 4 heads"));
  EXPECT_THAT(error("data=1,tensor=1,pipeline=5,micro_batch=1,num_micro_batches=8", 5),
              HasSubstr("LOOM_LAYOUT pipeline: 5 stages for 4 blocks"));
  // 1 + 2 = 3 blocks skip the last one; 2 + 3 = 5 repeat one.
  EXPECT_THAT(error("data=1,tensor=1,pipeline=2,micro_batch=1,num_micro_batches=8,blocks=1/2", 2),
              HasSubstr("LOOM_LAYOUT blocks: blocks=1/2 must give one count per stage"));
  EXPECT_THAT(error("data=1,tensor=1,pipeline=2,micro_batch=1,num_micro_batches=8,blocks=2/3", 2),
              HasSubstr("summing to the model's 4 blocks"));
  EXPECT_THAT(error("data=1,tensor=1,pipeline=2,micro_batch=1,num_micro_batches=8,blocks=1/1/2", 2),
              HasSubstr("LOOM_LAYOUT blocks"));
  EXPECT_THAT(ErrorOf([] { ParseLayout("data=1,micro_batch=1,num_micro_batches=1,blocks=2/0"); }),
              HasSubstr("LOOM_LAYOUT blocks"));
  EXPECT_THAT(
      ErrorOf([] { ParseLayout("data=1,micro_batch=1,num_micro_batches=1,schedule=zigzag"); }),
      HasSubstr("LOOM_LAYOUT schedule: expected 1f1b or gpipe"));
}

TEST(LayoutTest, StandaloneBatchShape) {
  JobConfig c = FromYaml(
      "model: {preset: tiny}\ndata: {builtin: tiny-corpus}\n"
      "train: {steps: 5, seq_len: 32, global_batch_tokens: 384}\n");
  BatchShape s = ResolveBatchShape(c, RankEnv{});  // 12 sequences: largest divisor <= 8 is 6
  EXPECT_EQ(s.B, 6);
  EXPECT_EQ(s.K, 2);
  c.micro_batch = 3;
  s = ResolveBatchShape(c, RankEnv{});
  EXPECT_EQ(s.B, 3);
  EXPECT_EQ(s.K, 4);
}

TEST(FlagsTest, FlagsOverlayTheSpec) {
  Flags f = ParseFlags({"--preset", "tiny", "--steps=7", "--lr", "0.002", "--batch", "2",
                        "--seq-len", "16", "--checkpoint-dir", "ck", "--export-llmc", "m.bin"});
  Value spec = ParseYaml(
      "model: {preset: small}\ndata: {builtin: tiny-corpus}\n"
      "train: {steps: 100, lr: 1e-4, warmupSteps: 3}\n",
      "job.yaml");
  JobConfig c = JobConfigFromValue(MergeSpecs(spec, f.overlay), "job.yaml");
  EXPECT_EQ(c.preset, "tiny");
  EXPECT_EQ(c.steps, 7);
  EXPECT_DOUBLE_EQ(c.lr, 0.002);
  EXPECT_EQ(c.warmup_steps, 3);  // kept from the spec
  EXPECT_EQ(c.micro_batch, 2);
  EXPECT_EQ(c.seq_len, 16);
  EXPECT_EQ(c.global_batch_tokens, 32);  // --batch without a global batch: B * T
  EXPECT_EQ(f.checkpoint_dir, "ck");
  EXPECT_EQ(f.export_llmc, "m.bin");
  EXPECT_THAT(ErrorOf([] { ParseFlags({"--stepz", "3"}); }), HasSubstr("--stepz: unknown flag"));
  EXPECT_THAT(ErrorOf([] { ParseFlags({"--steps"}); }), HasSubstr("--steps: expected a value"));
  EXPECT_TRUE(c.dp_overlap);  // the defaults
  EXPECT_DOUBLE_EQ(c.dp_bucket_mb, 25.0);
}

// parallelism.dp_bucket_mb and dp_overlap: from the spec (the doctor's EXPOSED_COMMUNICATION fix
// names them), flags win, bad values name the field.
TEST(FlagsTest, GradientBucketsFromTheSpecOrTheFlags) {
  const Value spec = ParseYaml(
      "model: {preset: tiny}\ndata: {builtin: tiny-corpus}\ntrain: {steps: 10}\n"
      "parallelism: {dp_bucket_mb: 0.5, dp_overlap: false}\n",
      "job.yaml");
  JobConfig c = JobConfigFromValue(MergeSpecs(spec, ParseFlags({}).overlay), "job.yaml");
  EXPECT_DOUBLE_EQ(c.dp_bucket_mb, 0.5);
  EXPECT_FALSE(c.dp_overlap);
  c = JobConfigFromValue(
      MergeSpecs(spec, ParseFlags({"--dp-bucket-mb", "4", "--dp-overlap=true"}).overlay),
      "job.yaml");
  EXPECT_DOUBLE_EQ(c.dp_bucket_mb, 4.0);
  EXPECT_TRUE(c.dp_overlap);
  for (const char* bad : {"0", "-1", "2048", "nan"}) {
    EXPECT_THAT(ErrorOf([&] {
                  JobConfigFromValue(MergeSpecs(spec, ParseFlags({"--dp-bucket-mb", bad}).overlay),
                                     "job.yaml");
                }),
                HasSubstr("parallelism.dp_bucket_mb"))
        << bad;
  }
  EXPECT_THAT(ErrorOf([&] {
                JobConfigFromValue(MergeSpecs(spec, ParseFlags({"--dp-overlap", "maybe"}).overlay),
                                   "job.yaml");
              }),
              HasSubstr("parallelism.dp_overlap: expected true or false"));
}

TEST(FlagsTest, Device) {
  EXPECT_EQ(ParseFlags({}).device, "");  // not given: LOOM_DEVICE decides, else the CPU
  EXPECT_EQ(ParseFlags({"--device", "cpu"}).device, "cpu");
  EXPECT_EQ(ParseFlags({"--device=cuda"}).device, "cuda");
  EXPECT_EQ(ParseFlags({"--device", "cuda:3"}).device, "cuda:3");
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CUDA"}) {
    EXPECT_THAT(ErrorOf([bad] {
                  ParseFlags({"--device", bad});
                }),
                HasSubstr("--device: expected cpu, cuda or cuda:N"))
        << bad;
  }
}

TEST(RankEnvTest, ReadsTheContractVariables) {
  std::map<std::string, std::string> vars = {
      {"LOOM_JOB", "jobs/j1"},
      {"LOOM_JOB_GENERATION", "3"},
      {"LOOM_RANK", "0"},
      {"LOOM_WORLD_SIZE", "1"},
      {"LOOM_DEVICE", "cpu:0"},
      {"LOOM_SPEC_FILE", "spec.json"},
      {"LOOM_CHECKPOINT_DIR", "ck"},
      {"LOOM_PROGRESS_FD", "3"},
      {"LOOM_LAYOUT", "data=1,tensor=1,pipeline=1,micro_batch=2,num_micro_batches=4"}};
  auto get = [&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
  RankEnv env = ReadRankEnv(get);
  EXPECT_EQ(env.job, "jobs/j1");
  EXPECT_EQ(env.generation, 3);
  EXPECT_EQ(env.progress_fd, 3);
  EXPECT_TRUE(env.has_layout);
  EXPECT_EQ(env.layout.num_micro_batches, 4);
  EXPECT_EQ(env.spec_file, "spec.json");
  EXPECT_EQ(env.checkpoint_dir, "ck");
  vars["LOOM_RANK"] = "5";
  EXPECT_THAT(ErrorOf([&] { ReadRankEnv(get); }), HasSubstr("LOOM_RANK: expected an integer"));
  vars["LOOM_RANK"] = "0";
  vars["LOOM_DEVICE"] = "tpu:0";
  EXPECT_THAT(ErrorOf([&] { ReadRankEnv(get); }), HasSubstr("LOOM_DEVICE"));
}

}  // namespace
}  // namespace loom::train
