#include "worker/agent/rank_environment.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/agent/trace_responder.h"

namespace loom::worker {

std::string FormatLayout(const loom::v1::Layout &l) {
  std::string out = absl::StrCat("data=", l.data(), ",tensor=", l.tensor(),
                                 ",pipeline=", l.pipeline(),
                                 ",micro_batch=", l.micro_batch(),
                                 ",num_micro_batches=", l.num_micro_batches());
  // The optional keys only when set, so the line stays short for plain data parallelism.
  if (l.blocks_per_stage_size() > 0) {
    absl::StrAppend(&out, ",blocks=", absl::StrJoin(l.blocks_per_stage(), "/"));
  }
  if (!l.schedule().empty()) absl::StrAppend(&out, ",schedule=", l.schedule());
  if (l.zero1()) absl::StrAppend(&out, ",zero1=1");
  return out;
}

std::map<std::string, std::string> BuildRankEnvironment(const loom::v1::Assignment &a,
                                                        const loom::v1::RankAssignment &rank,
                                                        const RankPaths &paths,
                                                        int64_t fence_timeout_ms) {
  std::map<std::string, std::string> env;
  for (const auto &[name, value] : a.spec().env())
    env[name] = value;
  const char *kind =
      rank.device_kind() == loom::v1::DEVICE_KIND_GPU ? "cuda" : "cpu";
  env["LOOM_JOB"] = a.job();
  env["LOOM_JOB_GENERATION"] = absl::StrCat(a.generation());
  env["LOOM_RANK"] = absl::StrCat(rank.rank());
  env["LOOM_WORLD_SIZE"] = absl::StrCat(a.world_size());
  env["LOOM_LOCAL_RANK"] = absl::StrCat(rank.local_rank());
  env["LOOM_LOCAL_WORLD_SIZE"] = absl::StrCat(a.ranks_size());
  env["LOOM_NODE_RANK"] = absl::StrCat(a.node_rank());
  env["LOOM_NUM_NODES"] = absl::StrCat(a.num_nodes());
  env["LOOM_DEVICE"] = absl::StrCat(kind, ":", rank.device_index());
  env["LOOM_LAYOUT"] = FormatLayout(a.layout());
  env["LOOM_RENDEZVOUS"] = a.rendezvous_address();
  if (!a.rendezvous_secret().empty())
    env["LOOM_RENDEZVOUS_SECRET"] = a.rendezvous_secret();
  env["LOOM_SPEC_FILE"] = paths.spec_file;
  env["LOOM_CHECKPOINT_DIR"] = paths.checkpoint_dir;
  env["LOOM_WORK_DIR"] = paths.work_dir;
  env["LOOM_TRACE_FILE"] = TraceFilePath(paths.work_dir, rank.rank());
  env["LOOM_PROGRESS_FD"] = absl::StrCat(kProgressFd);
  env["LOOM_FENCE_FD"] = absl::StrCat(kFenceFd);
  env["LOOM_FENCE_TIMEOUT_MS"] = absl::StrCat(fence_timeout_ms);
  return env;
}

int CpuThreadsPerDevice(int cores, int cpu_devices) {
  return std::max(1, std::max(1, cores) / std::max(1, cpu_devices));
}

void DefaultCpuThreads(int threads, std::map<std::string, std::string> *env) {
  for (const char *name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
    env->try_emplace(name, absl::StrCat(std::max(1, threads)));
  }
}

std::map<std::string, std::string>
InheritedEnvironment(const std::vector<std::string> &environ_entries,
                     const std::vector<std::string> &inherit) {
  std::map<std::string, std::string> out;
  for (const std::string &entry : environ_entries) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0)
      continue;
    const std::string name = entry.substr(0, eq);
    if (absl::StartsWith(name, "LOOM_"))
      continue; // never leak the worker's own LOOM_ vars
    for (const std::string &pattern : inherit) {
      const bool match =
          absl::EndsWith(pattern, "*")
              ? absl::StartsWith(name, pattern.substr(0, pattern.size() - 1))
              : name == pattern;
      if (match) {
        out[name] = entry.substr(eq + 1);
        break;
      }
    }
  }
  return out;
}

std::vector<std::string> DefaultInheritedEnvironment() {
  return {"PATH",   "HOME",      "USER",     "LANG",
          "LC_ALL", "TZ",        "TMPDIR",   "LD_LIBRARY_PATH",
          "CUDA_*", "NCCL_*",    "NVIDIA_*", "GLOO_*",
          "OMP_*",  "OPENBLAS_*", "LOOM_COMM_HOST"};
}

} // namespace loom::worker
