#include "worker/train/run.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/checkpoint/llmc.h"
#include "worker/train/checkpoint/retention.h"
#include "worker/train/checkpoint/storage_check.h"
#include "worker/train/comm/bootstrap.h"
#include "worker/train/comm/communicator.h"
#include "worker/train/config/flags.h"
#include "worker/train/config/job_config.h"
#include "worker/train/config/rank_env.h"
#include "worker/train/data/dataset.h"
#include "worker/train/device/caching_allocator.h"
#include "worker/train/diag/fence.h"
#include "worker/train/error.h"
#include "worker/train/measure/device_peaks.h"
#include "worker/train/profiler/trace_recorder.h"
#include "worker/train/progress.h"
#include "worker/train/trainer.h"

namespace loom::train {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Reads the spec (--spec, else LOOM_SPEC_FILE, else nothing) with the flags laid over it.
JobConfig LoadConfig(const Flags& flags, const RankEnv& env) {
  std::string source = !flags.spec_path.empty() ? flags.spec_path : env.spec_file;
  Value spec;
  spec.kind = Value::Kind::kObject;
  if (!source.empty()) spec = ParseSpecText(ReadFileOrThrow(source), source);
  Value merged = MergeSpecs(spec, flags.overlay);
  // With --init-from-llmc and no model in the spec, the file's header gives the dimensions.
  if (!flags.init_from_llmc.empty() && merged.is_object() && merged.Find("model") == nullptr) {
    ModelDims d = ReadLlmcDims(flags.init_from_llmc);
    Value model;
    model.kind = Value::Kind::kObject;
    auto add = [&model](const char* key, int v) {
      Value x;
      x.kind = Value::Kind::kNumber;
      x.text = std::to_string(v);
      model.members.emplace_back(key, x);
    };
    add("layers", d.layers);
    add("hidden", d.channels);
    add("heads", d.heads);
    add("seq_len", d.max_seq_len);
    add("vocab", d.vocab);
    merged.members.emplace_back("model", model);
  }
  return JobConfigFromValue(merged, source.empty() ? "flags" : source);
}

// How this rank meets the others (flags, environment and the entry point's loomd store), with
// LOOM_COMM_HOST and LOOM_COMM_TIMEOUT_S checked: for the CPU's communicators (ConnectRanks) and
// the GPU's NCCL (RunOptions::cuda_backend) alike.
RendezvousConfig RendezvousFrom(const Flags& flags, const RankEnv& env,
                                const std::function<const char*(const char*)>& getenv,
                                const RunOptions& options) {
  RendezvousConfig rc;
  rc.job = env.job;
  rc.generation = env.generation;
  rc.rank = env.rank;
  rc.world_size = env.world_size;
  const char* dir = getenv("LOOM_RENDEZVOUS_DIR");
  rc.store_dir = !flags.rendezvous_dir.empty() ? flags.rendezvous_dir : dir ? dir : "";
  const char* service = getenv("LOOM_RENDEZVOUS");
  rc.service = service ? service : "";
  rc.service_store = options.service_store;
  if (const char* h = getenv("LOOM_COMM_HOST"); h != nullptr && *h != '\0') {
    // Checked here, so a typo is a clear exit 2 rather than a retried connection failure.
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc_lookup = ::getaddrinfo(h, nullptr, &hints, &found);
    if (rc_lookup != 0) {
      throw BadInput("LOOM_COMM_HOST", std::string("cannot resolve \"") + h + "\" (" +
                                           ::gai_strerror(rc_lookup) +
                                           "): give this node's address on the cluster network");
    }
    ::freeaddrinfo(found);
    rc.host = h;
  }
  if (const char* t = getenv("LOOM_COMM_TIMEOUT_S"); t != nullptr && *t != '\0') {
    char* end = nullptr;
    double seconds = std::strtod(t, &end);
    if (*end != '\0' || !(seconds > 0.0) || seconds > 86400.0) {
      throw BadInput("LOOM_COMM_TIMEOUT_S",
                     std::string("expected seconds in (0, 86400], got \"") + t + "\"");
    }
    rc.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
  }
  return rc;
}

// The communicators of this rank, one per dimension and the world (DESIGN.md,
// "Communication", parallel/process_groups.h).
ProcessGroups ConnectRanks(const Flags& flags, const RankEnv& env, const BatchShape& shape,
                           const std::function<const char*(const char*)>& getenv,
                           const RunOptions& options) {
  const RendezvousConfig rc = RendezvousFrom(flags, env, getenv, options);
  ProcessGroups groups = ConnectGroups(rc, shape);
  if (rc.world_size > 1) {
    // Says which way the ranks met, so a log shows whether loomd or a directory was used.
    std::fprintf(stderr, "loom-train: rank %d of %d connected through %s\n", rc.rank, rc.world_size,
                 DescribeRendezvous(rc).c_str());
  }
  return groups;
}

TrainerComms CommsOf(const ProcessGroups& g) {
  return TrainerComms{g.world.get(), g.dp.get(),  g.tp.get(),
                      g.pp.get(),    g.emb.get(), g.pp_grad.get()};
}

// "dp=2 tp=2 pp=2 (blocks 2/2), 1f1b, zero1 on".
std::string LayoutString(const BatchShape& s) {
  std::string blocks;
  for (int p = 0; p < s.pp_size; ++p) {
    blocks += (p ? "/" : "") + std::to_string(s.stage_bounds[p + 1] - s.stage_bounds[p]);
  }
  return "dp=" + std::to_string(s.dp_size) + " tp=" + std::to_string(s.tp_size) +
         " pp=" + std::to_string(s.pp_size) + " (blocks " + blocks + "), micro-batch " +
         std::to_string(s.B) + " x " + std::to_string(s.K) + ", schedule " + s.schedule +
         ", zero1 " + (s.zero1 ? "on" : "off");
}

// Every rank must resume from the same step, or the gang would train different steps and hang
// in its collectives: the ranks compare what they found (a checkpoint directory that is not
// shared between nodes shows here) before anyone loads. Throws InputError naming
// checkpoint.dir unless every rank's step (-1: none) in `all` is the same.
void CheckSameResume(const std::vector<float>& all) {
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    auto seen = [](float step) {
      return step < 0 ? std::string("none") : "step " + std::to_string(static_cast<int64_t>(step));
    };
    throw BadInput("checkpoint.dir",
                   "the ranks see different checkpoints (rank 0: " + seen(all[0]) + ", rank " +
                       std::to_string(r) + ": " + seen(all[r]) +
                       "); every rank must see the same checkpoint directory: set checkpoint.dir "
                       "to a shared file system when the ranks run on several nodes");
  }
}

// The steps every rank found, as one sum over the world through the backend (each rank
// fills its own entry, the others are 0), so that it works on host (Gloo) and device (NCCL)
// communicators alike.
void AgreeOnResume(const std::optional<std::string>& resume, Communicator* world,
                   const RankEnv& env, Backend* backend) {
  // Steps travel as floats: exact below 2^24.
  std::vector<float> all(static_cast<size_t>(env.world_size), 0.0f);
  all[static_cast<size_t>(env.rank)] =
      resume ? static_cast<float>(ReadCheckpointMeta(*resume).step) : -1.0f;
  backend->AllReduceHost(world, all.data(), all.size());
  CheckSameResume(all);
}

// Where the model trains (issue 5). --device wins; without it, LOOM_DEVICE=cuda:N from
// loom-worker picks GPU N where the build has the CUDA backend and the GPU path can run the job,
// and otherwise the job trains on the CPU as before (with a note).
struct DevicePlan {
  bool cuda = false;
  int index = 0;  // the CUDA device
};

// The device index of "cuda:N" (flags and LOOM_DEVICE were validated). Plain "cuda" is device
// 0 for one rank and LOOM_LOCAL_RANK in a world of more, so that the ranks of one node started
// by hand with the same flags take different GPUs (NCCL refuses two ranks on one GPU).
int CudaIndexOf(const std::string& device, const RankEnv& env) {
  if (device.size() > 5) return std::atoi(device.c_str() + 5);
  return env.world_size > 1 ? env.local_rank : 0;
}

// What the GPU path cannot do yet for this run, or "" when it can run it.
std::string CudaUnsupported(const BatchShape& shape, const RunOptions& options) {
  const std::string layout = "(this layout: data " + std::to_string(shape.dp_size) + ", tensor " +
                             std::to_string(shape.tp_size) + ", pipeline " +
                             std::to_string(shape.pp_size) + ")";
  if (shape.dp_size * shape.tp_size * shape.pp_size > 1 && !options.cuda_data_parallel) {
    return "more than one GPU rank needs NCCL, and this loom-train was built without it " + layout;
  }
  return "";
}

DevicePlan PlanDevice(const Flags& flags, const RankEnv& env, const BatchShape& shape,
                      const RunOptions& options) {
  DevicePlan plan;
  if (!flags.device.empty()) {
    if (flags.device == "cpu") return plan;
    if (!options.cuda_backend) {
      throw BadInput("--device",
                     "this loom-train was built without the CUDA backend "
                     "(LOOM_CUDA=OFF or no nvcc); use --device cpu or a CUDA build");
    }
    const std::string problem = CudaUnsupported(shape, options);
    if (!problem.empty()) throw BadInput("--device", problem);
    plan.cuda = true;
    plan.index = CudaIndexOf(flags.device, env);
    return plan;
  }
  if (env.device.rfind("cuda:", 0) == 0 && options.cuda_backend) {
    std::string problem = CudaUnsupported(shape, options);
    const int count = options.cuda_device_count ? options.cuda_device_count() : 0;
    if (problem.empty() && CudaIndexOf(env.device, env) >= count) {
      problem = "this machine has " + std::to_string(count) + " CUDA device(s)";
    }
    if (problem.empty()) {
      plan.cuda = true;
      plan.index = CudaIndexOf(env.device, env);
    } else {
      std::fprintf(stderr, "loom-train: note: training in fp32 on the CPU (LOOM_DEVICE=%s): %s\n",
                   env.device.c_str(), problem.c_str());
    }
  }
  return plan;
}

// Says where a run resumed, and warns when the checkpoint's seed (hence data order) differs.
void ReportResume(const std::string& dir, const CheckpointMeta& meta, const JobConfig& config) {
  std::fprintf(stderr, "loom-train: resumed from %s (step %lld)\n", dir.c_str(),
               static_cast<long long>(meta.step));
  if (meta.seed != config.seed) {
    std::fprintf(stderr,
                 "loom-train: warning: the checkpoint was trained with seed %llu, "
                 "this run uses %llu (the data order changes)\n",
                 static_cast<unsigned long long>(meta.seed),
                 static_cast<unsigned long long>(config.seed));
  }
}

// The timeline ring (profiler/trace_ring.h) at LOOM_TRACE_FILE, where the worker asks for one;
// a ring that cannot be made costs the timeline only (one line on stderr), never the training.
std::unique_ptr<TraceRecorder> OpenTrace(const RankEnv& env,
                                         const std::function<const char*(const char*)>& getenv) {
  const char* path = getenv("LOOM_TRACE_FILE");
  if (path == nullptr || *path == '\0') return nullptr;
  return TraceRecorder::Open(path, env.rank, env.generation);
}

// The training loop, on any backend: steps, progress, evaluation, checkpoints and the stop
// request that the gang agreed on in a step (Trainer::Step).
int TrainLoop(const JobConfig& config, const BatchShape& shape, const RankEnv& env,
              const Flags& flags, const std::string& checkpoint_dir, Trainer& trainer) {
  // Every rank takes part in a save (Trainer::Save): dp rank 0 of each shard writes it.
  const bool writes_checkpoints = !checkpoint_dir.empty();
  Progress progress(env.rank, config.steps, env.progress_fd, ::isatty(2) == 1 && !flags.quiet);
  auto save = [&](int64_t step) {
    const auto save_start = std::chrono::steady_clock::now();
    const std::string saved = trainer.Save(checkpoint_dir, env.generation);
    // Announced by the ranks that wrote a shard, as before by the one writer of dp.
    if (shape.dp_rank == 0) progress.Checkpoint(step, saved, SecondsSince(save_start));
    // The committer prunes, after the commit that every rank waited for in Save.
    if (env.rank == 0) PruneCheckpoints(checkpoint_dir, config.checkpoint_keep);
  };
  while (trainer.step() < config.steps) {
    StepResult r = trainer.Step();
    progress.Step(r);
    const bool last = r.step == config.steps;
    if (config.eval_every > 0 && (r.step % config.eval_every == 0 || last)) {
      progress.Eval(r.step, trainer.Evaluate());
    }
    const bool periodic = config.checkpoint_every > 0 && r.step % config.checkpoint_every == 0;
    const bool stop = r.stop_requested && !last;
    if (writes_checkpoints && (periodic || last || stop)) save(r.step);
    if (stop) {
      std::fprintf(stderr, "loom-train: rank %d stopped on request after step %lld (%s)\n",
                   env.rank, static_cast<long long>(r.step),
                   writes_checkpoints ? "checkpoint saved" : "no checkpoint dir: nothing saved");
      return kExitStopped;
    }
  }
  return kExitOk;
}

// Test role only: TEST_ONLY_LOOM_SLOW_RANK=R:MS makes rank R sleep MS milliseconds at the start
// of each micro-batch's forward (the doctor's straggler tests; docs/rank-contract.md). Returns
// this rank's milliseconds (0 when unset or another rank). Malformed: exit 2 naming it.
int TestSlowRankMs(const std::function<const char*(const char*)>& getenv, int rank) {
  const char* v = getenv("TEST_ONLY_LOOM_SLOW_RANK");
  if (v == nullptr || *v == '\0') return 0;
  int r = -1, ms = -1;
  char tail = 0;
  if (std::sscanf(v, "%d:%d%c", &r, &ms, &tail) != 2 || r < 0 || ms < 0 || ms > 60000) {
    throw BadInput("TEST_ONLY_LOOM_SLOW_RANK",
                   std::string("\"") + v + "\" is not RANK:MS (MS in [0, 60000])");
  }
  return r == rank ? ms : 0;
}

int Run(const std::vector<std::string>& args, const std::function<const char*(const char*)>& getenv,
        const RunOptions& options) {
  // loom-worker measures its CPU devices with `loom-train --measure-device` when it starts
  // (measure/device_peaks.h): one JSON line on stdout, nothing else read or written.
  if (args.size() == 1 && args[0] == "--measure-device") {
    std::puts(CpuPeaksJson(MeasureCpuPeaks()).c_str());
    return kExitOk;
  }
  Flags flags = ParseFlags(args);
  if (flags.help) {
    std::fputs(FlagsUsage(), stdout);
    return kExitOk;
  }
  RankEnv env = ReadRankEnv(getenv);
  // Under loom-worker: stop if the worker freezes or goes (diag/fence.h).
  StartFenceWatchFromEnv(getenv);
  JobConfig config = LoadConfig(flags, env);
  BatchShape shape = ResolveBatchShape(config, env);
  std::string checkpoint_dir = !flags.checkpoint_dir.empty() ? flags.checkpoint_dir
                               : !env.checkpoint_dir.empty() ? env.checkpoint_dir
                                                             : config.checkpoint_dir;
  const DevicePlan device = PlanDevice(flags, env, shape, options);
  if (!device.cuda && options.cuda_backend == nullptr &&
      (env.device.rfind("cuda:", 0) == 0 || config.precision == "bf16")) {
    std::fprintf(stderr,
                 "loom-train: note: this build has only the CPU backend; training in "
                 "fp32 on the CPU (LOOM_DEVICE=%s, precision %s)\n",
                 env.device.c_str(), config.precision.c_str());
  } else if (!device.cuda && config.precision == "bf16" && env.device.rfind("cuda:", 0) != 0) {
    std::fprintf(stderr,
                 "loom-train: note: precision bf16 is the GPU path's (--device cuda); training "
                 "in fp32 on the CPU\n");
  }

  // Before anything slow (data, rendezvous, model): a checkpoint dir that cannot take a
  // checkpoint fails the job now and for good (exit 2). The GPU path checks once its device is
  // known to exist (after the backend is built), so that a wrong device is reported first.
  if (!checkpoint_dir.empty() && !device.cuda) {
    CheckCheckpointStorage(checkpoint_dir, CheckpointBytesEstimate(config.model));
  }
  Dataset data = Dataset::Load(config.data_path, config.data_builtin, config.val_path,
                               config.model.vocab, config.seq_len);
  const bool sharded = shape.tp_size > 1 || shape.pp_size > 1;
  if (sharded && (!flags.init_from_llmc.empty() || !flags.export_llmc.empty())) {
    throw BadInput(flags.init_from_llmc.empty() ? "--export-llmc" : "--init-from-llmc",
                   "llm.c model files need the whole model on each rank (tensor = pipeline = "
                   "1); convert through a checkpoint instead");
  }
  TrainerOptions trainer_options;
  trainer_options.bucket_bytes =
      std::max<size_t>(sizeof(float), static_cast<size_t>(config.dp_bucket_mb * 1048576.0));
  trainer_options.dp_overlap = config.dp_overlap;
  trainer_options.stop_requested = options.stop_requested;
  trainer_options.test_forward_sleep_ms = TestSlowRankMs(getenv, env.rank);
  // Before the groups and the trainer: they use it, and it outlives them.
  std::unique_ptr<TraceRecorder> trace = OpenTrace(env, getenv);
  trainer_options.trace = trace.get();
  // Outlive the trainer, which uses them.
  ProcessGroups groups;
  std::unique_ptr<Trainer> trainer;
  if (device.cuda) {
    // The device's NCCL groups meet through the same rendezvous as the CPU's communicators
    // (one rank ignores LOOM_COMM_* as on the CPU).
    RendezvousConfig rc;
    if (env.world_size > 1) rc = RendezvousFrom(flags, env, getenv, options);
    std::unique_ptr<Backend> backend = options.cuda_backend(config, shape, device.index, rc,
                                                            trainer_options.bucket_bytes, &groups);
    if (env.world_size > 1) {
      std::fprintf(stderr, "loom-train: rank %d of %d connected through %s; NCCL on cuda:%d\n",
                   env.rank, env.world_size, DescribeRendezvous(rc).c_str(), device.index);
    }
    if (!checkpoint_dir.empty()) {
      CheckCheckpointStorage(checkpoint_dir, CheckpointBytesEstimate(config.model));
    }
    if (config.precision != "bf16") {
      std::fprintf(stderr,
                   "loom-train: note: the GPU path trains in bf16 mixed precision (fp32 master "
                   "weights); precision %s is not available there\n",
                   config.precision.c_str());
    }
    trainer = std::make_unique<Trainer>(config, shape, data, CommsOf(groups), trainer_options,
                                        std::move(backend));
  } else {
    groups = ConnectRanks(flags, env, shape, getenv, options);
    trainer = std::make_unique<Trainer>(config, shape, data, CommsOf(groups), trainer_options);
  }
  try {
    if (!flags.init_from_llmc.empty()) {
      // Through the backend's host state, so that either device loads it (the whole model:
      // tensor = pipeline = 1, checked above); the moments start at zero.
      Backend& be = trainer->backend();
      std::vector<float> params(be.num_params());
      ImportLlmc(flags.init_from_llmc, be.dims(), be.tensors(), params.data());
      be.LoadState(params.data(), nullptr, nullptr, 0);
    }
    std::optional<std::string> resume;
    if (!checkpoint_dir.empty()) resume = FindLatestCheckpoint(checkpoint_dir);
    if (!checkpoint_dir.empty() && env.world_size > 1) {
      AgreeOnResume(resume, groups.world.get(), env, &trainer->backend());
    }
    if (resume) ReportResume(*resume, trainer->Resume(*resume), config);
    std::fprintf(stderr,
                 "loom-train: %s %s (%zu parameters), %lld steps of %d x %d x %d tokens, lr %g, "
                 "on %s%s%s\n",
                 config.preset.empty() ? "model" : config.preset.c_str(),
                 DimsString(config.model).c_str(), trainer->backend().num_params(),
                 static_cast<long long>(config.steps), shape.K, shape.B, shape.T, config.lr,
                 trainer->backend().device_name().c_str(), device.cuda ? " in bf16" : "",
                 checkpoint_dir.empty() ? ", no checkpoint dir" : "");
    if (env.world_size > 1) {
      std::fprintf(stderr,
                   "loom-train: rank %d of %d: layout %s; this rank dp %d, tp %d, pp %d, blocks "
                   "[%d, %d)\n",
                   env.rank, env.world_size, LayoutString(shape).c_str(), shape.dp_rank,
                   shape.tp_rank, shape.pp_rank, shape.first_block(), shape.last_block());
    }
    if (shape.dp_size > 1) {
      std::fprintf(stderr, "loom-train: rank %d of %d, data parallel %d, %zu gradient buckets\n",
                   env.rank, env.world_size, shape.dp_size, trainer->num_buckets());
    }
    const int code = TrainLoop(config, shape, env, flags, checkpoint_dir, *trainer);
    if (code == kExitOk && !flags.export_llmc.empty()) {
      Backend& be = trainer->backend();
      // A GPU under ZeRO-1 holds the fp32 masters of its range only: gather them (a dp
      // collective, so every dp rank takes part; the CPU's are whole and it leaves `full` empty).
      std::vector<float> full, m, v;
      if (shape.zero1 && shape.dp_size > 1) be.GatherState(&full, &m, &v);
      if (shape.dp_rank == 0) {
        const Backend::HostState state = be.StateToHost();
        ExportLlmc(flags.export_llmc, be.dims(), be.tensors(),
                   full.empty() ? state.params : full.data());
        std::fprintf(stderr, "loom-train: wrote %s\n", flags.export_llmc.c_str());
      }
    }
    return code;
  } catch (const CommError&) {
    if (device.cuda) {
      // Work queued behind a failed collective may never finish on the device, and destroying
      // the trainer or its groups synchronises their streams: leave the device to the process
      // exit (the caller exits on CommError), so that the rank ends instead of hanging.
      (void)trainer.release();
      (void)groups.world.release();
      (void)groups.tp.release();
      (void)groups.dp.release();
      (void)groups.pp.release();
      (void)groups.emb.release();
      (void)groups.pp_grad.release();
    }
    throw;
  }
}

}  // namespace

int RunLoomTrain(const std::vector<std::string>& args,
                 const std::function<const char*(const char*)>& getenv, const RunOptions& options) {
  try {
    return Run(args, getenv, options);
  } catch (const InputError& e) {
    std::fprintf(stderr, "loom-train: %s\n", e.what());
    return kExitBadInput;
  } catch (const OutOfMemoryError& e) {
    // The GPU path's caching allocator: the micro-batch does not fit on the device.
    std::fprintf(stderr, "loom-train: out of memory: %s\n", e.what());
    return kExitCrash;
  } catch (const IoError& e) {
    std::fprintf(stderr, "loom-train: %s\n", e.what());
    return kExitCrash;
  } catch (const CommError& e) {
    // A peer died or timed out: a crash, so that loomd restarts the gang.
    std::fprintf(stderr, "loom-train: communication: %s\n", e.what());
    return kExitCrash;
  }
}

}  // namespace loom::train
