// The loom-train and loom-tokenize binaries end to end: standalone with a YAML spec, as
// launched by loom-worker (LOOM_* environment, JSON spec, progress fd, resume), and bad input
// (exit 2, a one-line message naming the field or file, nothing overwritten).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/train/test_util.h"
#include "worker/train/comm/bootstrap.h"
#include "worker/train/config/json.h"

namespace loom::train {
namespace {

using ::testing::HasSubstr;
using testing::ReadText;
using testing::TempDir;
using testing::WriteText;

struct Result {
  int exit_code = -1;
  std::string out, err, progress;
};

// Runs `env_and_args` through the shell as "<env> loom-train <args>", stdout, stderr and fd 3
// captured in files of `dir`.
Result RunBinary(const TempDir& dir, const std::string& env, const std::string& args,
                 const char* binary = LOOM_TRAIN_BIN) {
  const std::string cmd = "cd '" + dir.path() + "' && " + env + " '" + binary + "' " + args +
                          " >out.txt 2>err.txt 3>progress.txt";
  int status = std::system(cmd.c_str());
  Result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadText(dir / "out.txt");
  r.err = ReadText(dir / "err.txt");
  r.progress = ReadText(dir / "progress.txt");
  return r;
}

std::vector<Value> JsonLines(const std::string& text) {
  std::vector<Value> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(ParseJson(line, "line"));
  }
  return lines;
}

std::vector<Value> Events(const std::vector<Value>& lines, const std::string& event) {
  std::vector<Value> out;
  for (const Value& v : lines) {
    if (v.Find("event") && v.Find("event")->text == event) out.push_back(v);
  }
  return out;
}

int64_t Int(const Value& v, const char* key) { return std::stoll(v.Find(key)->text); }

TEST(CliTest, StandaloneSpecFileRunsAndPrintsJsonLines) {
  TempDir dir;
  WriteText(dir / "job.yaml", R"(name: cli-test
model: {preset: tiny}
data: {builtin: tiny-corpus}
train: {steps: 6, seq_len: 16, global_batch_tokens: 64, lr: 2.0e-3, eval_every: 3}
parallelism: {micro_batch: 2}
checkpoint: {every_steps: 3}
)");
  Result r = RunBinary(dir, "LOOM_PROGRESS_FD=3", "--spec job.yaml --checkpoint-dir ck");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<Value> lines = JsonLines(r.out);
  std::vector<Value> steps = Events(lines, "step");
  ASSERT_EQ(steps.size(), 6u);
  for (size_t i = 0; i < steps.size(); ++i) {
    const Value& s = steps[i];
    EXPECT_EQ(Int(s, "step"), static_cast<int64_t>(i + 1));
    EXPECT_EQ(Int(s, "total_steps"), 6);
    EXPECT_EQ(Int(s, "rank"), 0);
    EXPECT_GT(std::stod(s.Find("loss")->text), 0.0);
    EXPECT_GT(std::stod(s.Find("tokens_per_second")->text), 0.0);
    for (const char* phase : {"data", "forward", "backward", "optimizer"}) {
      EXPECT_NE(s.Find("phases")->Find(phase), nullptr) << phase;
    }
    EXPECT_GT(Int(s, "memory_bytes"), 0);
    EXPECT_GE(Int(s, "peak_memory_bytes"), Int(s, "memory_bytes"));
  }
  std::vector<Value> evals = Events(lines, "eval");
  ASSERT_EQ(evals.size(), 2u);
  EXPECT_EQ(Int(evals[1], "step"), 6);
  std::vector<Value> checkpoints = Events(lines, "checkpoint");
  ASSERT_EQ(checkpoints.size(), 2u);
  EXPECT_EQ(checkpoints[1].Find("dir")->text, "ck/step-000006");
  EXPECT_TRUE(std::filesystem::exists(dir / "ck/step-000003/manifest.json"));
  // The progress fd carries the same lines.
  EXPECT_EQ(r.progress, r.out);
}

TEST(CliTest, UnderTheWorkerEnvironmentAndResume) {
  TempDir dir;
  auto spec = [](int steps) {
    return R"({"name": "job-1", "model": {"preset": "tiny", "layers": 0},
               "data": {"builtin": "tiny-corpus", "path": ""},
               "train": {"steps": ")" +
           std::to_string(steps) + R"(", "globalBatchTokens": "64",
                         "seqLen": 16, "lr": 0.002, "seed": "5"},
               "resources": {"gpus": 0, "cpuDevices": 1},
               "parallelism": {"auto": {}}, "checkpoint": {"everySteps": "0", "dir": ""},
               "restart": {"maxRestarts": 0}, "priority": 0, "env": {}})";
  };
  const std::string env =
      "LOOM_JOB=jobs/job-1 LOOM_JOB_GENERATION=1 LOOM_RANK=0 LOOM_WORLD_SIZE=1 "
      "LOOM_DEVICE=cpu:0 LOOM_SPEC_FILE=spec.json LOOM_CHECKPOINT_DIR=ck LOOM_PROGRESS_FD=3 "
      "LOOM_LAYOUT=data=1,tensor=1,pipeline=1,micro_batch=2,num_micro_batches=2";
  WriteText(dir / "spec.json", spec(4));
  Result first = RunBinary(dir, env, "");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_EQ(Events(JsonLines(first.progress), "step").size(), 4u);
  ASSERT_TRUE(std::filesystem::exists(dir / "ck/step-000004/manifest.json"));

  // A restarted gang with more steps continues from the checkpoint.
  WriteText(dir / "spec.json", spec(7));
  Result second = RunBinary(dir, env, "");
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_THAT(second.err, HasSubstr("resumed from ck/step-000004"));
  std::vector<Value> steps = Events(JsonLines(second.progress), "step");
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(Int(steps[0], "step"), 5);
  EXPECT_EQ(Int(steps[2], "step"), 7);
}

// The issue: a read-only or full checkpoint directory was retried until the restarts were spent,
// and checkpoints were never pruned. Now the first is exit 2 (permanent) before any step, with
// errno in the message, and checkpoint.keep prunes the oldest complete checkpoints.
TEST(CliTest, AnUnwritableCheckpointDirExitsTwoAndKeepPrunes) {
  TempDir dir;
  auto spec = [](const std::string& checkpoint) {
    return R"({"name": "job-1", "model": {"preset": "tiny"}, "data": {"builtin": "tiny-corpus"},
               "train": {"steps": "5", "globalBatchTokens": "64", "seqLen": 16},
               "resources": {"cpuDevices": 1}, "checkpoint": )" +
           checkpoint + "}";
  };
  std::string unwritable = "/sys";  // root ignores permissions; sysfs refuses new files
  if (::geteuid() != 0) {
    unwritable = dir / "ro";
    std::filesystem::create_directory(unwritable);
    ::chmod(unwritable.c_str(), 0555);
  }
  const std::string env =
      "LOOM_JOB=jobs/job-1 LOOM_JOB_GENERATION=1 LOOM_RANK=0 LOOM_WORLD_SIZE=1 "
      "LOOM_DEVICE=cpu:0 LOOM_SPEC_FILE=spec.json LOOM_PROGRESS_FD=3 "
      "LOOM_LAYOUT=data=1,tensor=1,pipeline=1,micro_batch=2,num_micro_batches=2 ";
  WriteText(dir / "spec.json", spec(R"({"everySteps": "1", "keep": 2})"));
  Result bad = RunBinary(dir, env + "LOOM_CHECKPOINT_DIR=" + unwritable, "");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_THAT(bad.err, HasSubstr("loom-train: checkpoint.dir: " + unwritable + " is not writable"));
  EXPECT_THAT(bad.err, ::testing::ContainsRegex("\\(errno [0-9]+\\)"));
  EXPECT_EQ(bad.progress, "") << "not one step trained";

  Result good = RunBinary(dir, env + "LOOM_CHECKPOINT_DIR=ck", "");
  ASSERT_EQ(good.exit_code, 0) << good.err;
  std::vector<std::string> kept;
  for (const auto& e : std::filesystem::directory_iterator(dir / "ck")) {
    kept.push_back(e.path().filename().string());
  }
  std::sort(kept.begin(), kept.end());
  EXPECT_THAT(kept, ::testing::ElementsAre("step-000004", "step-000005"));
  EXPECT_EQ(Events(JsonLines(good.progress), "checkpoint").size(), 5u);
}

TEST(CliTest, BadInputExitsTwoWithAOneLineMessage) {
  TempDir dir;
  const std::string flags = "--data-builtin tiny-corpus --steps 2 --batch 2 --seq-len 16";
  auto expect_bad = [&](const std::string& env, const std::string& args,
                        const std::string& needle) {
    Result r = RunBinary(dir, env, args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(needle)) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.out, "") << args;
  };
  WriteText(dir / "bad.yaml",
            "model: {layers: 2, hidden: 64, heads: 5, seq_len: 64, vocab: "
            "256}\ndata: {builtin: tiny-corpus}\ntrain: {steps: 3}\n");
  expect_bad("", "--spec bad.yaml", "bad.yaml: model.heads: 5 does not divide model.hidden 64");
  WriteText(dir / "typo.yaml",
            "model: {preset: tiny}\ndata: {builtin: tiny-corpus}\n"
            "train: {steps: 3, learning_rate: 1}\n");
  expect_bad("", "--spec typo.yaml", "typo.yaml: train.learning_rate: unknown key");
  expect_bad("", "--spec missing.yaml", "missing.yaml: cannot open");
  expect_bad("", "--preset tiny " + flags + " --seq-len 65", "train.seq_len: expected 1..64");
  // A communication address that does not resolve is bad input, named, before any rendezvous.
  expect_bad(
      "LOOM_WORLD_SIZE=2 LOOM_COMM_HOST=no-such-host.invalid "
      "LOOM_LAYOUT=data=2,tensor=1,pipeline=1,micro_batch=1,num_micro_batches=1",
      "--preset tiny " + flags, "LOOM_COMM_HOST: cannot resolve \"no-such-host.invalid\"");
  // Issue 4's bad layouts reach the process as exit 2 before any rendezvous.
  expect_bad(
      "LOOM_WORLD_SIZE=3 LOOM_LAYOUT=data=1,tensor=1,pipeline=3,micro_batch=1,num_micro_batches=2",
      "--preset tiny " + flags, "LOOM_LAYOUT pipeline: 3 stages for 2 blocks");
  expect_bad(
      "LOOM_WORLD_SIZE=2 LOOM_LAYOUT=data=1,tensor=1,pipeline=2,micro_batch=1,num_micro_batches=2",
      "--preset tiny " + flags + " --export-llmc m.bin",
      "--export-llmc: llm.c model files need the whole model on each rank");
  expect_bad("LOOM_LAYOUT=data=2,tensor=1,pipeline=1,micro_batch=1,num_micro_batches=1",
             "--preset tiny " + flags,
             "LOOM_LAYOUT: data*tensor*pipeline = 2 but LOOM_WORLD_SIZE = 1");
  expect_bad(
      "LOOM_WORLD_SIZE=2 LOOM_RANK=0 "
      "LOOM_LAYOUT=data=2,tensor=1,pipeline=1,micro_batch=1,num_micro_batches=2",
      "--preset tiny " + flags + " --global-batch-tokens 64", "LOOM_WORLD_SIZE: 2 ranks need");
  WriteText(dir / "tokens.bin", std::string(1024, '\0'));
  expect_bad("", "--preset tiny --data tokens.bin --steps 2", "tokens.bin: bad magic 0");
  // The GPU path (issue 5) refuses what it cannot do yet before touching a device, in a build
  // with or without CUDA: other layouts; and a device that is no device (here: none at all),
  // before it creates the checkpoint dir.
  expect_bad("", "--preset tiny " + flags + " --device tpu", "--device: expected cpu, cuda");
  expect_bad("", "--preset tiny " + flags + " --device cuda --checkpoint-dir ck-gpu", "--device: ");
  EXPECT_FALSE(std::filesystem::exists(dir / "ck-gpu"));
  // Data parallelism on the GPU: refused without NCCL, else the missing device is found before
  // any rendezvous (which would wait for rank 1).
  expect_bad(
      "LOOM_WORLD_SIZE=2 LOOM_RANK=0 "
      "LOOM_LAYOUT=data=2,tensor=1,pipeline=1,micro_batch=1,num_micro_batches=2",
      "--preset tiny " + flags + " --global-batch-tokens 64 --device cuda", "--device: ");
  // Tensor parallelism is refused on the GPU (or, in a build without CUDA, --device cuda is).
  expect_bad(
      "LOOM_WORLD_SIZE=2 LOOM_RANK=0 "
      "LOOM_LAYOUT=data=1,tensor=2,pipeline=1,micro_batch=1,num_micro_batches=2",
      "--preset tiny " + flags + " --global-batch-tokens 32 --device cuda", "--device: ");

  // A checkpoint of another model: refused, and left exactly as it was.
  Result made = RunBinary(dir, "", "--hidden 32 --preset tiny " + flags + " --checkpoint-dir ck");
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string model_file = dir / "ck/step-000002/model.safetensors";
  const std::string before = ReadText(model_file);
  expect_bad("", "--preset tiny " + flags + " --steps 5 --checkpoint-dir ck",
             "does not match the configured model");
  EXPECT_EQ(ReadText(model_file), before);
  EXPECT_FALSE(std::filesystem::exists(dir / "ck/step-000005"));
}

TEST(CliTest, TokenizeTrainExportAndImport) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 300; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  WriteText(dir / "text.txt", text);
  Result tok = RunBinary(dir, "", "text.txt text.bin", LOOM_TOKENIZE_BIN);
  ASSERT_EQ(tok.exit_code, 0) << tok.err;
  EXPECT_EQ(std::filesystem::file_size(dir / "text.bin"), 1024 + 2 * text.size());
  Result bad = RunBinary(dir, "", "nothing.txt out.bin", LOOM_TOKENIZE_BIN);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("nothing.txt: cannot open"));

  Result train = RunBinary(dir, "",
                           "--preset tiny --data text.bin --steps 3 --batch 2 --seq-len 16 "
                           "--export-llmc model.bin");
  ASSERT_EQ(train.exit_code, 0) << train.err;
  // Starting from the exported weights with no model in the spec: dimensions from the file.
  Result again = RunBinary(dir, "",
                           "--init-from-llmc model.bin --data text.bin --steps 1 --batch 2 "
                           "--seq-len 16 --lr 1e-9 --export-llmc copy.bin");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  // One step at a learning rate of 1e-9 barely moves the weights: the files nearly agree.
  std::string a = ReadText(dir / "model.bin"), b = ReadText(dir / "copy.bin");
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(a.substr(0, 1024), b.substr(0, 1024));
  const float* fa = reinterpret_cast<const float*>(a.data() + 1024);
  const float* fb = reinterpret_cast<const float*>(b.data() + 1024);
  double diff = 0;
  for (size_t i = 0; i < (a.size() - 1024) / 4; ++i)
    diff = std::max(diff, double{std::fabs(fa[i] - fb[i])});
  EXPECT_LT(diff, 1e-6);
}

// Ranks that see different checkpoints (a checkpoint directory not shared between nodes) would
// train different steps and hang in their collectives: they compare what they found first and
// all exit 2, naming checkpoint.dir.
TEST(CliTest, RanksSeeingDifferentCheckpointsExitTwo) {
  if (!HaveMultiProcessComm()) GTEST_SKIP() << "built without Gloo: two ranks need it";
  TempDir dir;
  const std::string flags =
      "--data-builtin tiny-corpus --preset tiny --batch 1 --seq-len 16 "
      "--global-batch-tokens 32 --quiet";
  Result first = RunBinary(dir, "", flags + " --steps 2 --checkpoint-dir ck-a");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_TRUE(std::filesystem::exists(dir / "ck-a/step-000002/manifest.json"));
  // Rank 0 sees ck-a (step 2), rank 1 an empty ck-b.
  // (Statements, not an && list: a list ending in & would run in the background as a whole.)
  std::string cmd = "cd '" + dir.path() + "' || exit 1; export LOOM_WORLD_SIZE=2 " +
                    "LOOM_COMM_TIMEOUT_S=60 " +
                    "LOOM_LAYOUT=data=2,tensor=1,pipeline=1,micro_batch=1,num_micro_batches=1 " +
                    "LOOM_RENDEZVOUS_DIR=rv; ";
  for (int r = 0; r < 2; ++r) {
    cmd += "(LOOM_RANK=" + std::to_string(r) + " '" + LOOM_TRAIN_BIN + "' " + flags +
           " --steps 4 --checkpoint-dir ck-" + (r == 0 ? "a" : "b") + " 2>err" + std::to_string(r) +
           ".txt; echo $? >rc" + std::to_string(r) + ".txt) & ";
  }
  cmd += "wait";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  for (int r = 0; r < 2; ++r) {
    const std::string rc = ReadText(dir / ("rc" + std::to_string(r) + ".txt"));
    const std::string err = ReadText(dir / ("err" + std::to_string(r) + ".txt"));
    EXPECT_EQ(rc, "2\n") << "rank " << r << ":\n" << err;
    EXPECT_THAT(err, HasSubstr("checkpoint.dir: the ranks see different checkpoints (rank 0: "
                               "step 2, rank 1: none)"))
        << "rank " << r;
  }
  // Nothing was trained or saved on top.
  EXPECT_FALSE(std::filesystem::exists(dir / "ck-a/step-000004"));
}

}  // namespace
}  // namespace loom::train
