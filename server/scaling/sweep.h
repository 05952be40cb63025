// The scaling sweep's pure parts (issue 12, part 5): the request's checks, the copy's spec at
// each size, and the state machine that says what the sweep does next given its stored state
// and its current copy's job state. No clock, no I/O: ScaleTestManager (scale_test_manager.h)
// applies the actions; tests drive this from tables.
//
// The sweep runs ONE SIZE AT A TIME: copies running together on CPU devices would share cores
// and ruin each other's figures. Point i's copy is created only once point i-1 is measured.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/repeated_field.h"
#include "loom/v1/scaling.pb.h"

namespace loom::scaling {

inline constexpr int kMaxSizes = 8;
inline constexpr int64_t kDefaultSteps = 20;
inline constexpr int64_t kMinSteps = 4;
inline constexpr int64_t kMaxSteps = 10000;

// Steps of each copy not measured: a quarter of the steps, at least 2 (allocation, cold caches,
// the first collectives), so that at least half remain.
int64_t WarmupSteps(int64_t steps);

// INVALID_ARGUMENT naming `devices` and the fix unless: 1..kMaxSizes entries, each positive,
// strictly increasing, the last at most `available` (the READY nodes' devices of the job's
// kind, named by `kind`: "GPUs" or "CPU devices").
absl::Status CheckDevices(const google::protobuf::RepeatedField<int32_t>& devices, int available,
                          const std::string& kind);

// INVALID_ARGUMENT naming `steps` unless 0 (the default) or kMinSteps..kMaxSteps.
absl::Status CheckSteps(int64_t steps);

// The copy of `base` for `devices` devices: resources set to that size (the kind of `base`),
// parallelism as the job says at that size (auto: the planner's, at that size; explicit: tensor
// x pipeline kept, data = devices / (tensor x pipeline), INVALID_ARGUMENT naming the size when
// it does not divide), train.steps = `steps`, train.global_batch_tokens = `global_batch_tokens`
// (0: the validator's default), no evaluation, no restarts, rebalance off (nothing may change
// the layout under a measurement), and the name "<base name>-scale-<devices>" (cut to 63
// characters).
absl::StatusOr<v1::JobSpec> SpecForSize(const v1::JobSpec& base, int devices, int64_t steps,
                                        int64_t global_batch_tokens);

// The current copy as the manager sees it.
struct CopyView {
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  std::string reason;  // the job's state_reason
};

enum class ActionKind {
  kNone,        // the sweep has ended: nothing to do
  kCreateCopy,  // create the copy of points[index]
  kWait,        // the copy of points[index] is queued or running
  kMeasure,     // the copy of points[index] succeeded: measure it, then go on
  kFail,        // end the sweep FAILED with `reason`
  kFinish,      // every size is measured: attribute, raise findings, SUCCEEDED
};

struct Action {
  ActionKind kind = ActionKind::kNone;
  int index = -1;
  std::string reason;
};

// What a sweep in `sweep`'s state does next; `copy` is the state of points[index]'s job when it
// has one (nullopt when it could not be read: the manager then waits).
Action NextAction(const v1::ScaleTest& sweep, const std::optional<CopyView>& copy);

// The index of the point being worked on (the first not measured), or -1 when all are.
int CurrentIndex(const v1::ScaleTest& sweep);

// Whether `state` is terminal.
bool IsTerminal(v1::ScaleTestState state);

}  // namespace loom::scaling
