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

// Selects from `environ_entries` ("NAME=value" strings) those whose name is listed in `inherit`
// or matches a listed prefix written with a trailing '*' (e.g. "NCCL_*").
std::map<std::string, std::string> InheritedEnvironment(
    const std::vector<std::string>& environ_entries, const std::vector<std::string>& inherit);

// The environment lists that the worker passes through by default.
std::vector<std::string> DefaultInheritedEnvironment();

}  // namespace loom::worker
