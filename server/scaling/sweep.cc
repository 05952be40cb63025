#include "server/scaling/sweep.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace loom::scaling {
namespace {

bool ExplicitLayout(const v1::ParallelismSpec& p) {
  return !p.has_auto_() && (p.data() > 0 || p.tensor() > 0 || p.pipeline() > 0);
}

}  // namespace

int64_t WarmupSteps(int64_t steps) { return std::max<int64_t>(2, steps / 4); }

absl::Status CheckDevices(const google::protobuf::RepeatedField<int32_t>& devices, int available,
                          const std::string& kind) {
  if (devices.empty()) {
    return absl::InvalidArgumentError(
        "devices is required: the sizes to run, e.g. 1,2,4 (at most 8, increasing)");
  }
  if (devices.size() > kMaxSizes) {
    return absl::InvalidArgumentError(absl::StrCat("devices has ", devices.size(),
                                                   " sizes; give at most ", kMaxSizes,
                                                   " (each size is a job run in turn)"));
  }
  for (int i = 0; i < devices.size(); ++i) {
    if (devices[i] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("devices[", i, "] is ", devices[i],
                                                     "; every size must be a positive count"));
    }
    if (i > 0 && devices[i] <= devices[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices[", i, "] is ", devices[i], " after ", devices[i - 1],
                       "; list the sizes strictly increasing, e.g. 1,2,4,8"));
    }
  }
  if (devices[devices.size() - 1] > available) {
    return absl::InvalidArgumentError(
        absl::StrCat("devices[", devices.size() - 1, "] is ", devices[devices.size() - 1],
                     " but the cluster has ", available, " ", kind,
                     " on its READY nodes; drop the sizes above ", available, " or add nodes"));
  }
  return absl::OkStatus();
}

absl::Status CheckSteps(int64_t steps) {
  if (steps == 0 || (steps >= kMinSteps && steps <= kMaxSteps)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("steps is ", steps, "; give ", kMinSteps, "..",
                                                 kMaxSteps, " steps per copy (default ",
                                                 kDefaultSteps, ")"));
}

absl::StatusOr<v1::JobSpec> SpecForSize(const v1::JobSpec& base, int devices, int64_t steps,
                                        int64_t global_batch_tokens) {
  v1::JobSpec spec = base;
  if (base.resources().gpus() > 0) {
    spec.mutable_resources()->set_gpus(devices);
    spec.mutable_resources()->set_cpu_devices(0);
  } else {
    spec.mutable_resources()->set_cpu_devices(devices);
    spec.mutable_resources()->set_gpus(0);
  }
  v1::ParallelismSpec* p = spec.mutable_parallelism();
  if (ExplicitLayout(base.parallelism())) {
    const int tensor = std::max(1, base.parallelism().tensor());
    const int pipeline = std::max(1, base.parallelism().pipeline());
    const int fixed = tensor * pipeline;
    if (devices % fixed != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices: ", devices, " devices cannot run the job's layout tensor ", tensor,
                       " x pipeline ", pipeline, " (", fixed,
                       " devices per data-parallel replica); give sizes "
                       "that are multiples of ",
                       fixed, ", or parallelism: {auto: {}}"));
    }
    p->set_tensor(tensor);
    p->set_pipeline(pipeline);
    p->set_data(devices / fixed);
  }
  spec.mutable_train()->set_steps(steps);
  spec.mutable_train()->set_global_batch_tokens(global_batch_tokens);
  spec.mutable_train()->set_eval_every(0);
  spec.mutable_restart()->set_max_restarts(0);
  spec.mutable_checkpoint()->set_every_steps(0);
  spec.mutable_rebalance()->set_mode("off");
  const std::string suffix = absl::StrCat("-scale-", devices);
  std::string name = base.name().empty() ? "job" : base.name();
  if (name.size() + suffix.size() > 63) name.resize(63 - suffix.size());
  while (!name.empty() && name.back() == '-') name.pop_back();
  spec.set_name(name + suffix);
  return spec;
}

int CurrentIndex(const v1::ScaleTest& sweep) {
  for (int i = 0; i < sweep.points_size(); ++i) {
    if (!sweep.points(i).measured()) return i;
  }
  return -1;
}

bool IsTerminal(v1::ScaleTestState state) {
  return state == v1::SCALE_TEST_SUCCEEDED || state == v1::SCALE_TEST_FAILED ||
         state == v1::SCALE_TEST_CANCELLED;
}

Action NextAction(const v1::ScaleTest& sweep, const std::optional<CopyView>& copy) {
  if (sweep.state() != v1::SCALE_TEST_RUNNING) return {ActionKind::kNone, -1, ""};
  const int index = CurrentIndex(sweep);
  if (index < 0) return {ActionKind::kFinish, -1, ""};
  const v1::ScalePoint& point = sweep.points(index);
  if (point.job().empty()) return {ActionKind::kCreateCopy, index, ""};
  if (!copy.has_value()) return {ActionKind::kWait, index, ""};
  switch (copy->state) {
    case v1::SUCCEEDED:
      return {ActionKind::kMeasure, index, ""};
    case v1::FAILED:
    case v1::CANCELLED:
      return {ActionKind::kFail, index,
              absl::StrCat("the copy at ", point.devices(), " devices (", point.job(), ") ended ",
                           v1::JobState_Name(copy->state), ": ", copy->reason)};
    default:
      return {ActionKind::kWait, index, ""};
  }
}

}  // namespace loom::scaling
