// The environment of one rank process, exactly as docs/rank-contract.md lists it.
//
// The result is the contract's LOOM_* variables, then the job spec's `env`, on top of a small
// set of variables inherited from the worker's own environment (PATH, library paths, NCCL
// tuning: whatever the operator passed to the worker, named by `inherit`). Contract variables
// always win; spec.env may override inherited ones but never a LOOM_ one (the validator refuses
// such specs anyway).
//
// Threading: pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loom/v1/node.pb.h"

namespace loom::worker {

// Where a rank's files live on this node.
struct RankPaths {
  std::string work_dir;        // LOOM_WORK_DIR: <work-dir>/jobs/<job-id>
  std::string spec_file;       // LOOM_SPEC_FILE: <work_dir>/spec.json
  std::string checkpoint_dir;  // LOOM_CHECKPOINT_DIR
};

// The fd number on which ranks write progress lines.
inline constexpr int kProgressFd = 3;
// The read end of the fence pipe (launcher.h): a rank that hears nothing on it for
// LOOM_FENCE_TIMEOUT_MS stops itself, its worker being frozen or gone.
inline constexpr int kFenceFd = 5;
inline constexpr int64_t kDefaultFenceTimeoutMs = 30'000;

// "data=D,tensor=T,pipeline=P,micro_batch=M,num_micro_batches=K"
std::string FormatLayout(const loom::v1::Layout& layout);

// The contract variables plus spec.env. `assignment` must have passed ValidateAssignment.
std::map<std::string, std::string> BuildRankEnvironment(
    const loom::v1::Assignment& assignment, const loom::v1::RankAssignment& rank,
    const RankPaths& paths, int64_t fence_timeout_ms = kDefaultFenceTimeoutMs);

// The threads a CPU device's rank computes with unless told otherwise: the cores the worker's
// ranks run on, shared evenly among the node's CPU devices, and at least one (with more CPU
// devices than cores the ranks time-share the cores). Left to themselves, OpenMP and OpenBLAS
// start a thread per core in every rank: N ranks would run N times as many threads as cores.
int CpuThreadsPerDevice(int cores, int cpu_devices);

// Sets OMP_NUM_THREADS and OPENBLAS_NUM_THREADS to `threads` (>= 1) where `env` does not set
// them already: the job's spec.env and the worker's own environment (an operator's choice) win.
void DefaultCpuThreads(int threads, std::map<std::string, std::string>* env);

// Selects from `environ_entries` ("NAME=value" strings) those whose name is listed in `inherit`
// or matches a listed prefix written with a trailing '*' (e.g. "NCCL_*").
std::map<std::string, std::string> InheritedEnvironment(
    const std::vector<std::string>& environ_entries, const std::vector<std::string>& inherit);

// The environment lists that the worker passes through by default.
std::vector<std::string> DefaultInheritedEnvironment();

}  // namespace loom::worker
