// YAML job specs -> JobSpec through the protobuf JSON mapping (common/spec_yaml.h), set by
// reflection (common/json_message.h) with the result of protobuf's JSON parser.
#include "common/spec_yaml.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/spec_json_reference.h"

namespace loom {
namespace {

using ::testing::HasSubstr;

// The example of DESIGN.md, verbatim.
constexpr char kDesignExample[] = R"(name: gpt2-small-demo
model: {preset: gpt2-124m}          # or layers/hidden/heads/seq_len/vocab
data: {path: data/train.bin}        # token file; or builtin: tiny-corpus
train: {steps: 2000, global_batch_tokens: 524288, lr: 6.0e-4, precision: bf16}
resources: {gpus: 8}
parallelism: {auto: {}}             # or {data: 2, tensor: 2, pipeline: 2, micro_batch: 4}
checkpoint: {every_steps: 200}
restart: {max_restarts: 3}
)";

TEST(SpecYamlTest, DesignExampleConverts) {
  auto spec = JobSpecFromYaml(kDesignExample, "job.yaml", "/srv/jobs");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "gpt2-small-demo");
  EXPECT_EQ(spec->model().preset(), "gpt2-124m");
  EXPECT_EQ(spec->data().path(), "/srv/jobs/data/train.bin");
  EXPECT_EQ(spec->train().steps(), 2000);
  EXPECT_EQ(spec->train().global_batch_tokens(), 524288);
  EXPECT_DOUBLE_EQ(spec->train().lr(), 6.0e-4);
  EXPECT_EQ(spec->train().precision(), "bf16");
  EXPECT_EQ(spec->resources().gpus(), 8);
  EXPECT_TRUE(spec->parallelism().has_auto_());  // `{}` stays an (empty, present) message
  EXPECT_EQ(spec->checkpoint().every_steps(), 200);
  EXPECT_EQ(spec->restart().max_restarts(), 3);
}

TEST(SpecYamlTest, BlockStyleEqualsFlowStyle) {
  constexpr char kBlock[] = R"(
name: demo
model:
  layers: 2
  hidden: 64
  heads: 4
  seq_len: 64
  vocab: 256
data:
  builtin: tiny-corpus
train:
  steps: 10
  lr: 0.001
resources:
  cpu_devices: 4
parallelism:
  data: 2
  tensor: 2
  pipeline: 1
  micro_batch: 4
env:
  FOO: bar
  STEPS: 5
)";
  constexpr char kFlow[] =
      "{name: demo, model: {layers: 2, hidden: 64, heads: 4, seq_len: 64, vocab: 256},"
      " data: {builtin: tiny-corpus}, train: {steps: 10, lr: 0.001},"
      " resources: {cpu_devices: 4},"
      " parallelism: {data: 2, tensor: 2, pipeline: 1, micro_batch: 4},"
      " env: {FOO: bar, STEPS: 5}}";
  auto block = JobSpecFromYaml(kBlock, "block.yaml", "");
  auto flow = JobSpecFromYaml(kFlow, "flow.yaml", "");
  ASSERT_TRUE(block.ok()) << block.status();
  ASSERT_TRUE(flow.ok()) << flow.status();
  // Maps serialise in no fixed order: compare field by field.
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*block, *flow));
  EXPECT_EQ(block->model().seq_len(), 64);
  EXPECT_EQ(block->parallelism().tensor(), 2);
  EXPECT_FALSE(block->parallelism().has_auto_());
  // A number written for a string field (env values are strings) keeps its text.
  EXPECT_EQ(block->env().at("STEPS"), "5");
  EXPECT_EQ(block->env().at("FOO"), "bar");
}

TEST(SpecYamlTest, CamelCaseAndSnakeCaseKeysAreTheSameField) {
  auto snake = JobSpecFromYaml(
      "train: {steps: 3, global_batch_tokens: 4096, warmup_steps: 2}\n"
      "resources: {cpu_devices: 2}\nrestart: {max_restarts: 1, backoff_seconds: 0.5}\n",
      "a.yaml", "");
  auto camel = JobSpecFromYaml(
      "train: {steps: 3, globalBatchTokens: 4096, warmupSteps: 2}\n"
      "resources: {cpuDevices: 2}\nrestart: {maxRestarts: 1, backoffSeconds: 0.5}\n",
      "b.yaml", "");
  ASSERT_TRUE(snake.ok()) << snake.status();
  ASSERT_TRUE(camel.ok()) << camel.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*snake, *camel));
  EXPECT_EQ(camel->train().global_batch_tokens(), 4096);
  EXPECT_EQ(camel->resources().cpu_devices(), 2);
  EXPECT_DOUBLE_EQ(camel->restart().backoff_seconds(), 0.5);
}

TEST(SpecYamlTest, BothSpellingsOfOneKeyAreRejected) {
  auto spec = JobSpecFromYaml("train:\n  warmup_steps: 1\n  warmupSteps: 2\n", "x.yaml", "");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("x.yaml:3:3: train.warmupSteps: given twice"));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("line 2"));
}

TEST(SpecYamlTest, UnknownKeyNamesPathLineAndSuggestion) {
  auto spec = JobSpecFromYaml("name: x\nmodel:\n  presett: tiny\n", "job.yaml", "");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("job.yaml:3:3: model.presett: unknown key"));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("did you mean 'preset'"));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("preset, layers, hidden"));
}

TEST(SpecYamlTest, UnknownTopLevelKeyInFlowStyle) {
  auto spec = JobSpecFromYaml("{name: x, gpus: 4}", "job.yaml", "");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("job.yaml:1:11: gpus: unknown key"));
}

TEST(SpecYamlTest, WrongTypesNameTheKeyAndLine) {
  struct Case {
    const char* yaml;
    const char* expected;
  };
  const Case cases[] = {
      {"train:\n  steps: many\n", "job.yaml:2:10: train.steps: expected an integer, got \"many\""},
      {"train:\n  steps: 1.5\n", "train.steps: expected an integer, got \"1.5\""},
      {"train: {lr: fast}\n", "job.yaml:1:13: train.lr: expected a number, got \"fast\""},
      {"resources: {gpus: 99999999999}\n", "resources.gpus: 99999999999 is out of range"},
      {"model: tiny\n", "job.yaml:1:8: model: expected a mapping of ModelSpec fields"},
      {"model: {preset: [a, b]}\n", "model.preset: expected a string, got a list"},
      {"env: [A, B]\n", "env: expected a mapping"},
      {"- a\n- b\n", "a job spec must be a YAML mapping"},
  };
  for (const Case& c : cases) {
    auto spec = JobSpecFromYaml(c.yaml, "job.yaml", "");
    ASSERT_FALSE(spec.ok()) << c.yaml;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.expected)) << c.yaml;
  }
}

TEST(SpecYamlTest, IntegersWrittenAsExponentsAreAccepted) {
  auto spec = JobSpecFromYaml("train: {steps: 1e3, global_batch_tokens: '4096'}\n", "j", "");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->train().steps(), 1000);
  EXPECT_EQ(spec->train().global_batch_tokens(), 4096);
}

TEST(SpecYamlTest, SyntaxErrorNamesLineAndColumn) {
  auto spec = JobSpecFromYaml("name: x\nmodel: {preset: tiny\ntrain: {steps: 1}\n", "job.yaml", "");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("YAML syntax error"));
  EXPECT_THAT(std::string(spec.status().message()),
              ::testing::MatchesRegex("job\\.yaml:[0-9]+:[0-9]+: .*"));

  spec = JobSpecFromYaml("a: b: c\n", "job.yaml", "");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("job.yaml:1:5: YAML syntax error"));
}

TEST(SpecYamlTest, EmptyAndMultiDocumentInputsAreRejected) {
  auto spec = JobSpecFromYaml("# nothing\n", "job.yaml", "");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("job.yaml: the job spec is empty"));
  spec = JobSpecFromYaml("name: a\n---\nname: b\n", "job.yaml", "");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("expected one YAML document"));
}

TEST(SpecYamlTest, TextThatIsNotUtf8IsRefusedWithItsKey) {
  // Found by tests/fuzz/spec_yaml_fuzz: loomctl aborted (an uncaught nlohmann::json exception)
  // on a spec holding bytes that are not UTF-8.
  auto spec = JobSpecFromYaml("name: \xa1\n", "job.yaml", "");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("job.yaml: name: not UTF-8 text (byte 0xA1 at offset 0)"));
  spec = JobSpecFromYaml("env: {A\xc3: ok}\n", "job.yaml", "");  // a key cut short
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("env.(a key): not UTF-8 text"));
  // Well-formed multi-byte text is fine.
  spec = JobSpecFromYaml("env: {GREETING: \"gr\xc3\xbc\xc3\x9f \xe2\x9c\x93\"}\n", "job.yaml", "");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->env().at("GREETING"), "gr\xc3\xbc\xc3\x9f \xe2\x9c\x93");
}

// loomd returns these errors to the client (CreateJobRequest.spec_yaml): a key or value of the
// spec is quoted and cut (common/echo.h), never repeated whole or with its control bytes.
TEST(SpecYamlTest, ErrorsQuoteLongOrBinaryKeysAndValuesCut) {
  // YAML allows implicit keys of at most 1,024 characters.
  const std::string long_value(100000, 'x');
  const std::string long_key(1000, 'k');
  for (const std::string& yaml :
       {"train:\n  steps: \"" + long_value + "\\x1b[2J\"\n",  // a value
        "env:\n  \"K\\x1b[2J" + long_key + "\": [1]\n",       // a map key
        "model:\n  " + long_key + ": 1\n",                    // an unknown key
        "model: {layers: \"\\t" + long_value + "\"}\n"}) {    // a quoted value
    auto spec = JobSpecFromYaml(yaml, "job.yaml", "");
    ASSERT_FALSE(spec.ok());
    const std::string message(spec.status().message());
    EXPECT_LT(message.size(), 600u) << message.substr(0, 600);
    EXPECT_THAT(message, HasSubstr("...\" (10"));
    for (char c : message) EXPECT_GE(static_cast<unsigned char>(c), 0x20) << message;
  }
  // Short plain keys still read as written.
  auto spec = JobSpecFromYaml("env: {PATH_X: [1]}\n", "job.yaml", "");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("job.yaml:1:15: env.PATH_X: "));
}

TEST(SpecYamlTest, AStrayCommaIsASyntaxErrorNotAHang) {
  // Found by tests/fuzz/spec_yaml_fuzz: yaml-cpp's LoadAll never returns on ", # ".
  for (const char* text : {", # ", ",", "name: a\n,\n"}) {
    auto spec = JobSpecFromYaml(text, "job.yaml", "");
    ASSERT_FALSE(spec.ok()) << text;
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr("YAML syntax error")) << text;
  }
}

TEST(SpecYamlTest, RelativePathsResolveAgainstTheSpecDirectory) {
  auto spec = JobSpecFromYaml(
      "data: {path: ../tokens/train.bin, val_path: /abs/val.bin}\ncheckpoint: {dir: ckpt}\n",
      "job.yaml", "/home/u/exp");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().path(), "/home/u/tokens/train.bin");
  EXPECT_EQ(spec->data().val_path(), "/abs/val.bin");
  EXPECT_EQ(spec->checkpoint().dir(), "/home/u/exp/ckpt");
}

// Resolving paths adds no message the YAML did not have: `checkpoint {}` would make the spec
// differ from the same spec sent as a message.
TEST(SpecYamlTest, ResolvingPathsAddsNoEmptyMessage) {
  auto spec = JobSpecFromYaml("name: x\n", "job.yaml", "/home/u/exp");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->has_data());
  EXPECT_FALSE(spec->has_checkpoint());
}

TEST(SpecYamlTest, LoadJobSpecFileUsesTheFileDirectory) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "spec_yaml_test_dir";
  std::filesystem::create_directories(dir);
  const std::filesystem::path file = dir / "job.yaml";
  {
    std::ofstream out(file);
    out << "data: {path: train.bin}\nresources: {cpu_devices: 1}\n";
  }
  auto spec = LoadJobSpecFile(file.string());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().path(), (dir / "train.bin").lexically_normal().string());

  auto missing = LoadJobSpecFile((dir / "nope.yaml").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("nope.yaml"));
  std::filesystem::remove_all(dir);
}

// What loomctl reads and sends (ReadJobSpecFile), and what loomd makes of it
// (JobSpecFromYamlMessage), which checks the fields a client could have forged.
TEST(SpecYamlTest, ReadJobSpecFileSendsTextSourceAndDirectory) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "spec_yaml_read_dir";
  std::filesystem::create_directories(dir);
  const std::filesystem::path file = dir / "job.yaml";
  {
    std::ofstream out(file);
    out << "data: {path: train.bin}\n";
  }
  auto yaml = ReadJobSpecFile(file.string());
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_EQ(yaml->text(), "data: {path: train.bin}\n");
  EXPECT_EQ(yaml->source(), file.string());
  EXPECT_EQ(std::filesystem::path(yaml->base_dir()), std::filesystem::absolute(dir));
  auto spec = JobSpecFromYamlMessage(*yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().path(), (std::filesystem::absolute(dir) / "train.bin").string());

  // Only a megabyte and a byte are read of a file that never ends.
  auto endless = ReadJobSpecFile("/dev/zero");
  ASSERT_FALSE(endless.ok());
  EXPECT_THAT(std::string(endless.status().message()),
              HasSubstr("/dev/zero: the job spec is over 1048576 bytes"));
  std::filesystem::remove_all(dir);
}

TEST(SpecYamlTest, JobSpecFromYamlMessageChecksSourceAndBaseDir) {
  v1::JobSpecYaml yaml;
  yaml.set_text("data: {path: t.bin}\nmodel: {layers: x}\n");
  // No source: errors call the text spec_yaml.
  auto unnamed = JobSpecFromYamlMessage(yaml);
  ASSERT_FALSE(unnamed.ok());
  EXPECT_THAT(std::string(unnamed.status().message()), HasSubstr("spec_yaml:2:"));
  yaml.set_text("data: {path: t.bin}\n");
  auto as_written = JobSpecFromYamlMessage(yaml);
  ASSERT_TRUE(as_written.ok()) << as_written.status();
  EXPECT_EQ(as_written->data().path(), "t.bin");

  for (const std::string& bad : {std::string("a\nb"), std::string("\x1b]0;x\x07"),
                                 std::string(600, 's'), std::string("a\x7f")}) {
    v1::JobSpecYaml forged = yaml;
    forged.set_source(bad);
    auto spec = JobSpecFromYamlMessage(forged);
    ASSERT_FALSE(spec.ok());
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr("spec_yaml.source:"));
  }
  for (const std::string& bad :
       {std::string("relative/dir"), std::string("/a\0b", 4), "/" + std::string(5000, 'd')}) {
    v1::JobSpecYaml forged = yaml;
    forged.set_base_dir(bad);
    auto spec = JobSpecFromYamlMessage(forged);
    ASSERT_FALSE(spec.ok());
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr("spec_yaml.base_dir:"));
  }
  v1::JobSpecYaml huge;
  huge.set_text(std::string((1 << 20) + 1, '#'));
  auto refused = JobSpecFromYamlMessage(huge);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("spec_yaml.text:"));
}

TEST(SpecYamlTest, EmptyValueOfAMessageFieldMeansPresent) {
  auto spec = JobSpecFromYaml("parallelism:\n  auto:\nname:\n", "job.yaml", "");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->parallelism().has_auto_());
  EXPECT_EQ(spec->name(), "");
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// JobSpecFromYaml sets the message by reflection instead of handing the checked JSON to
// protobuf's JSON parser (0.2-0.3 ms of a CLI call): on every spec here, from the examples to
// edge cases of each field type, both give the same message. The spec_yaml fuzz target checks
// the same on arbitrary input.
TEST(SpecYamlTest, ReflectionGivesWhatProtobufsJsonParserGives) {
  std::vector<std::string> specs = {
      kDesignExample,
      "name: x\nresources: {cpu_devices: 2}\nenv: {A: 1, B: 'two', C: '', D: true}\n",
      "train: {steps: 5e3, lr: .nan, global_batch_tokens: 9223372036854775807}\n",
      "train: {lr: .inf, weight_decay: -.inf}\n",
      "train: {lr: -0.0, steps: 0}\nresources: {gpus: 0}\n",
      "parallelism: {auto: }\nrebalance: {}\ncheckpoint: \n",
      "name: 2024\npriority: -7\n",
      "model: {layers: 2, hidden: 64, heads: 2, seq_len: 32, vocab: 256}\n",
      "data: {builtin: tiny-corpus}\nrestart: {max_restarts: 0}\n",
      "name: \"caf\\u00e9 \\U0001F600\"\nenv: {\"K\\tX\": \"v\\nw\"}\n",
  };
  for (const char* example : {"demo.yaml", "parallel.yaml", "gpt2-1.5b.yaml"}) {
    std::ifstream in(std::filesystem::path(LOOM_EXAMPLES_DIR) / example);
    ASSERT_TRUE(in) << example;
    specs.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  for (const std::string& text : specs) {
    SCOPED_TRACE(text);
    const absl::StatusOr<loom::v1::JobSpec> spec = JobSpecFromYaml(text, "job.yaml", "");
    ASSERT_TRUE(spec.ok()) << spec.status();
    const absl::StatusOr<nlohmann::json> checked = internal::JobSpecJson(text, "job.yaml");
    ASSERT_TRUE(checked.ok()) << checked.status();
    const absl::StatusOr<loom::v1::JobSpec> reference =
        loom::testing::JobSpecByProtobufJsonParser(*checked);
    ASSERT_TRUE(reference.ok()) << reference.status();
    EXPECT_TRUE(loom::testing::SameSpec(*spec, *reference))
        << spec->DebugString() << "\n--- protobuf's JSON parser ---\n"
        << reference->DebugString();
  }
}

}  // namespace
}  // namespace loom
