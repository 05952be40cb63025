// loom-train's device path (run.cc: LOOM_DEVICE=cuda:N and RunOptions::cuda_backend) driven
// through RunLoomTrain with a test-role backend that runs on the CPU (CpuStandInBackend: the CPU
// backend handed in through the CUDA factory), so the device path's wiring (the factory's
// device, checkpoints, resume, progress) is tested on machines without a GPU. The CUDA backend
// itself is tested in cuda_trainer_test.cc.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/planner/layout.h"
#include "server/planner/layout_search.h"
#include "tests/train/test_util.h"
#include "worker/train/config/json.h"
#include "worker/train/cpu_backend.h"
#include "worker/train/data/token_file.h"
#include "worker/train/run.h"
#include "worker/train/trainer.h"

namespace loom::train {
namespace {

using ::testing::HasSubstr;
using testing::ReadText;
using testing::TempDir;

// Test role: a "device" backend that is the CPU backend. Counts the state it hands out for
// checkpoints (saves) and the state it loads (resumes).
class CpuStandInBackend : public CpuBackend {
 public:
  CpuStandInBackend(const JobConfig& config)
      : CpuBackend(config.model, ModelShard{1, 0, 0, config.model.layers}, config.seed,
                   CpuBackendOptions{}) {}
  HostState StateToHost() override {
    ++saves;
    return CpuBackend::StateToHost();
  }
  void LoadState(const float* params, const float* m, const float* v, int64_t step) override {
    ++resumes;
    CpuBackend::LoadState(params, m, v, step);
  }
  static inline int saves = 0;
  static inline int resumes = 0;
};

struct RunResult {
  int exit_code = -1;
  std::vector<double> losses;            // per step line, in order
  std::vector<std::string> checkpoints;  // "dir" of each checkpoint line
  std::vector<int> devices;              // the device index each factory call got
};

// Runs loom-train in-process on "cuda:0" (a machine with one device, the stand-in trainer) with
// `args`, or on the CPU path when !device; progress lines go to a file through LOOM_PROGRESS_FD.
RunResult RunOnStandIn(const TempDir& dir, const std::string& args, bool device = true) {
  RunResult result;
  const std::string progress = dir / "progress.jsonl";
  std::filesystem::remove(progress);
  const int fd = ::open(progress.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  EXPECT_GE(fd, 0);
  const std::string fd_text = std::to_string(fd);
  auto getenv = [&](const char* name) -> const char* {
    const std::string n = name;
    if (n == "LOOM_DEVICE") return device ? "cuda:0" : nullptr;
    if (n == "LOOM_PROGRESS_FD") return fd_text.c_str();
    return nullptr;
  };
  RunOptions options;
  options.cuda_device_count = [] { return 1; };
  options.cuda_backend = [&](const JobConfig& config, const BatchShape& shape, int device,
                             const RendezvousConfig&, size_t,
                             ProcessGroups* groups) -> std::unique_ptr<Backend> {
    EXPECT_EQ(shape.dp_size * shape.tp_size * shape.pp_size, 1);
    result.devices.push_back(device);
    *groups = ProcessGroups::Alone();
    return std::make_unique<CpuStandInBackend>(config);
  };
  const std::vector<std::string> argv = absl::StrSplit(args, ' ', absl::SkipEmpty());
  result.exit_code = RunLoomTrain(argv, getenv, options);
  ::close(fd);
  std::string text = ReadText(progress);
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty()) continue;
    Value v = ParseJson(line, "progress");
    const std::string event = v.Find("event")->text;
    if (event == "step") result.losses.push_back(std::stod(v.Find("loss")->text));
    if (event == "checkpoint") result.checkpoints.push_back(v.Find("dir")->text);
  }
  return result;
}

const char kFlags[] =
    "--preset tiny --data-builtin tiny-corpus --batch 2 --seq-len 16 --seed 7 --quiet "
    "--checkpoint-every 2 ";

// Eight steps at once; then steps 5 to 8 resumed from the step-4 checkpoint: the same curve as
// eight steps at once, and the checkpoints of the device path are announced as on the CPU path.
TEST(DeviceRunTest, CheckpointsAndResumeOnTheDevicePath) {
  TempDir dir;
  CpuStandInBackend::saves = CpuStandInBackend::resumes = 0;
  const std::string straight_dir = dir / "straight";
  RunResult straight = RunOnStandIn(dir, std::string(kFlags) + "--steps 8 --checkpoint-dir " +
                                             straight_dir);
  ASSERT_EQ(straight.exit_code, 0);
  ASSERT_EQ(straight.losses.size(), 8u);
  EXPECT_EQ(straight.devices, std::vector<int>{0});
  EXPECT_EQ(CpuStandInBackend::saves, 4);  // steps 2, 4, 6, 8
  EXPECT_EQ(CpuStandInBackend::resumes, 0);
  ASSERT_EQ(straight.checkpoints.size(), 4u);
  EXPECT_THAT(straight.checkpoints.back(), HasSubstr("step-000008"));

  // The second half resumes from the straight run's step-4 checkpoint alone (the learning-rate
  // schedule depends on --steps, so both halves are runs of the same 8-step job).
  const std::string split_dir = dir / "split";
  ASSERT_TRUE(std::filesystem::exists(straight_dir + "/step-000004/manifest.json"));
  std::filesystem::create_directories(split_dir);
  std::filesystem::copy(straight_dir + "/step-000004", split_dir + "/step-000004",
                        std::filesystem::copy_options::recursive);
  CpuStandInBackend::saves = CpuStandInBackend::resumes = 0;
  RunResult resumed =
      RunOnStandIn(dir, std::string(kFlags) + "--steps 8 --checkpoint-dir " + split_dir);
  ASSERT_EQ(resumed.exit_code, 0);
  EXPECT_EQ(CpuStandInBackend::resumes, 1);
  EXPECT_EQ(CpuStandInBackend::saves, 2);  // steps 6 and 8
  ASSERT_EQ(resumed.losses.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(resumed.losses[i], straight.losses[4 + i]) << i;
  EXPECT_TRUE(std::filesystem::exists(split_dir + "/step-000008/manifest.json"));
}

// llm.c model files on the device path: written from the backend's host state and read into it
// (LoadState), so a file written there starts a run with the same first loss on the device path
// and on the CPU path.
TEST(DeviceRunTest, LlmcFilesAreWrittenAndReadOnTheDevicePath) {
  TempDir dir;
  const std::string file = dir / "model.bin";
  CpuStandInBackend::saves = CpuStandInBackend::resumes = 0;
  RunResult wrote = RunOnStandIn(dir, std::string(kFlags) + "--steps 2 --export-llmc " + file);
  ASSERT_EQ(wrote.exit_code, 0);
  EXPECT_EQ(CpuStandInBackend::saves, 1);  // the export's StateToHost
  ASSERT_TRUE(std::filesystem::exists(file));
  CpuStandInBackend::resumes = 0;
  RunResult on_device =
      RunOnStandIn(dir, std::string(kFlags) + "--steps 1 --init-from-llmc " + file);
  ASSERT_EQ(on_device.exit_code, 0);
  EXPECT_EQ(CpuStandInBackend::resumes, 1);  // the import's LoadState
  RunResult on_cpu = RunOnStandIn(dir, std::string(kFlags) + "--steps 1 --init-from-llmc " + file,
                                  /*device=*/false);
  ASSERT_EQ(on_cpu.exit_code, 0);
  ASSERT_EQ(on_device.losses.size(), 1u);
  ASSERT_EQ(on_cpu.losses.size(), 1u);
  EXPECT_EQ(on_device.losses[0], on_cpu.losses[0]);
  // And the trained model, not the initial one: the first loss differs from a fresh start's.
  RunResult fresh = RunOnStandIn(dir, std::string(kFlags) + "--steps 1", /*device=*/false);
  ASSERT_EQ(fresh.losses.size(), 1u);
  EXPECT_NE(fresh.losses[0], on_cpu.losses[0]);
}

// What the CUDA factory was asked for, by a run whose factory stops it there (test role).
struct FactoryCall {
  bool reached = false;
  BatchShape shape;
  int device = -1;
};

// loom-train with `args` and the rank environment `env` on "cuda:0" of a machine without a GPU,
// up to the point of the first CUDA call: the factory records its arguments and refuses with
// a marker error (exit 2).
int RunToTheFactory(const std::string& args, const std::map<std::string, std::string>& env,
                    FactoryCall* call, std::string* err) {
  auto getenv = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  RunOptions options;
  options.cuda_device_count = [] { return 1; };
  options.cuda_data_parallel = true;
  options.cuda_backend = [&](const JobConfig&, const BatchShape& shape, int device,
                             const RendezvousConfig&, size_t,
                             ProcessGroups*) -> std::unique_ptr<Backend> {
    call->reached = true;
    call->shape = shape;
    call->device = device;
    throw BadInput("test-role factory", "stopped before the first CUDA call");
  };
  const std::vector<std::string> argv = absl::StrSplit(args, ' ', absl::SkipEmpty());
  ::testing::internal::CaptureStderr();
  const int code = RunLoomTrain(argv, getenv, options);
  *err = ::testing::internal::GetCapturedStderr();
  return code;
}

// Issue 14: a model that needs tensor and pipeline parallelism on GPUs (gpt-7b on 16 H100s, as
// `loomctl plan` plans it, restricted to no activation recompute, which loom-train does not run,
// and to no ZeRO-1, with which data 16 alone fits) gets a layout that loom-train accepts with
// --device cuda, every rank of it up to the CUDA backend's factory with its own coordinates and
// stage blocks.
TEST(DeviceRunTest, APlannedTensorAndPipelineLayoutReachesTheCudaBackend) {
  planner::PlanRequest req;
  req.model = *planner::ResolvePreset("gpt-7b");
  req.devices = *planner::DefaultDevice("H100-SXM", 16, 8);
  req.batch.global_batch_sequences = 64;
  req.options.recompute = {planner::Recompute::kNone};
  req.options.allow_zero1 = false;
  const absl::StatusOr<planner::PlanResult> plan = planner::PlanLayouts(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_FALSE(plan->ranked.empty());
  const planner::Evaluation& best = plan->ranked.front();
  const planner::Layout& l = best.layout;
  ASSERT_GT(l.tp * l.pp, 1) << "gpt-7b should need tensor or pipeline parallelism on an H100: "
                            << planner::LayoutString(l);
  std::printf("planned: %s\n", planner::LayoutString(l).c_str());
  std::string blocks;
  for (int b : best.blocks_per_stage) blocks += (blocks.empty() ? "" : "/") + std::to_string(b);
  const std::string layout = "data=" + std::to_string(l.dp) + ",tensor=" + std::to_string(l.tp) +
                             ",pipeline=" + std::to_string(l.pp) +
                             ",micro_batch=" + std::to_string(l.micro_batch) +
                             ",num_micro_batches=" + std::to_string(l.num_micro_batches) +
                             ",blocks=" + blocks + ",schedule=1f1b,zero1=" + (l.zero1 ? "1" : "0");
  // A token file long enough for 2048-token sequences, ids below the vocabulary.
  TempDir dir;
  std::vector<uint16_t> tokens(50'000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i * 7919 % 50'000);
  WriteTokenFile(dir / "tokens.bin", tokens);
  const std::string args =
      "--layers 32 --hidden 4096 --heads 32 --model-seq-len 2048 --vocab "
      "50257 --seq-len 2048 --steps 1 --global-batch-tokens " +
      std::to_string(64 * 2048) + " --data " + (dir / "tokens.bin") + " --rendezvous-dir " +
      (dir / "rendezvous") + " --device cuda";
  const int world = l.world();
  for (int rank : {0, world - 1}) {
    SCOPED_TRACE("rank " + std::to_string(rank) + " of " + layout);
    FactoryCall call;
    std::string err;
    const std::map<std::string, std::string> env = {{"LOOM_RANK", std::to_string(rank)},
                                                    {"LOOM_WORLD_SIZE", std::to_string(world)},
                                                    {"LOOM_LOCAL_RANK", std::to_string(rank % 8)},
                                                    {"LOOM_LAYOUT", layout}};
    EXPECT_EQ(RunToTheFactory(args, env, &call, &err), 2);
    EXPECT_THAT(err, HasSubstr("stopped before the first CUDA call")) << err;
    ASSERT_TRUE(call.reached) << err;
    EXPECT_EQ(call.device, rank % 8);  // plain "cuda": the local rank's GPU
    EXPECT_EQ(call.shape.tp_size, l.tp);
    EXPECT_EQ(call.shape.pp_size, l.pp);
    EXPECT_EQ(call.shape.dp_size, l.dp);
    EXPECT_EQ(call.shape.zero1, l.zero1 && l.dp > 1);
    EXPECT_EQ(call.shape.pp_rank, rank / (l.tp * l.dp));
    EXPECT_EQ(call.shape.last_block() - call.shape.first_block(),
              best.blocks_per_stage[call.shape.pp_rank]);
  }
}

// ZeRO-1 runs on the GPU too: the layout reaches the CUDA backend's factory with zero1 set.
TEST(DeviceRunTest, ZeroOneReachesTheCudaBackend) {
  TempDir dir;
  FactoryCall call;
  std::string err;
  const int code = RunToTheFactory(
      "--preset tiny --data-builtin tiny-corpus --seq-len 16 --steps 1 --global-batch-tokens 64 "
      "--rendezvous-dir " +
          (dir / "rendezvous") + " --device cuda",
      {{"LOOM_RANK", "1"},
       {"LOOM_WORLD_SIZE", "2"},
       {"LOOM_LOCAL_RANK", "1"},
       {"LOOM_LAYOUT", "data=2,tensor=1,pipeline=1,micro_batch=1,num_micro_batches=2,zero1=1"}},
      &call, &err);
  EXPECT_EQ(code, 2);
  EXPECT_THAT(err, HasSubstr("stopped before the first CUDA call")) << err;
  ASSERT_TRUE(call.reached) << err;
  EXPECT_TRUE(call.shape.zero1);
  EXPECT_EQ(call.shape.dp_size, 2);
  EXPECT_EQ(call.shape.dp_rank, 1);
  EXPECT_EQ(call.device, 1);
}

}  // namespace
}  // namespace loom::train
