#include "server/planner_service/plan_mapping.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/planner/measured_peaks.h"
#include "server/planner/model_shape.h"
#include "server/planner/plan_explanation.h"
#include "server/planner_service/cluster_devices.h"

namespace loom::planner_service {
namespace {

using planner::Evaluation;

// The validator's default batch: this many sequences per data-parallel rank
// (server/jobs/spec_validator.cc), so that a plan and a created job agree on the batch.
constexpr int64_t kDefaultSequencesPerRank = 8;

absl::Status Invalid(absl::string_view field, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

absl::Status Precondition(absl::string_view field, const std::string& problem) {
  return absl::FailedPreconditionError(absl::StrCat(field, ": ", problem));
}

absl::StatusOr<planner::ModelShape> ModelFromSpec(const v1::ModelSpec& spec) {
  struct Dim {
    const char* field;
    int given;
    int planner::ModelShape::*dim;
  };
  const Dim dims[] = {{"layers", spec.layers(), &planner::ModelShape::layers},
                      {"hidden", spec.hidden(), &planner::ModelShape::hidden},
                      {"heads", spec.heads(), &planner::ModelShape::heads},
                      {"seq_len", spec.seq_len(), &planner::ModelShape::seq_len},
                      {"vocab", spec.vocab(), &planner::ModelShape::vocab}};
  planner::ModelShape m;
  if (!spec.preset().empty()) {
    absl::StatusOr<planner::ModelShape> preset = planner::ResolvePreset(spec.preset());
    if (!preset.ok()) return Invalid("spec.model.preset", std::string(preset.status().message()));
    m = *std::move(preset);
    // Dimensions beside a preset must agree with it, as the validator requires.
    for (const Dim& d : dims) {
      if (d.given != 0 && d.given != m.*d.dim) {
        return Invalid(
            absl::StrCat("spec.model.", d.field),
            absl::StrCat(d.given, " conflicts with preset ", spec.preset(), " (", d.field, " ",
                         m.*d.dim, "); drop the preset or the explicit dimensions"));
      }
    }
    return m;
  }
  m.name = "custom";
  for (const Dim& d : dims) {
    if (d.given <= 0) {
      return Invalid(absl::StrCat("spec.model.", d.field),
                     absl::StrCat(d.given,
                                  " must be > 0; set spec.model.preset or all five of "
                                  "layers, hidden, heads, seq_len and vocab"));
    }
    m.*d.dim = d.given;
  }
  absl::Status valid = planner::ValidateModel(m);
  if (!valid.ok()) return Invalid("spec", std::string(valid.message()));
  return m;
}

// "+12% step time against plan 1" style comparison.
std::string Slower(double seconds, double best_seconds, absl::string_view against) {
  if (!(best_seconds > 0)) return "";
  const double extra = (seconds / best_seconds - 1) * 100;
  if (extra < 0.5) return absl::StrCat("as fast as ", against);
  return absl::StrFormat("+%.0f%% step time against %s", extra,
                         std::string(against.data(), against.size()));
}

// Reasons shared by every plan: memory, recompute, pipeline shape.
void AddCommonReasons(const Evaluation& e, v1::Plan& plan) {
  plan.add_reasons(absl::StrCat("peak ", planner::FormatGiB(e.peak_memory.total()), " of ",
                                planner::FormatGiB(e.peak_memory.total() + e.headroom_bytes),
                                " per device (stage ", e.peak_stage, "), headroom ",
                                planner::FormatGiB(e.headroom_bytes)));
  if (e.layout.recompute != planner::Recompute::kNone) {
    // The search tries a stronger recompute only when the weaker ones do not fit.
    plan.add_reasons(absl::StrCat("recompute=", planner::RecomputeName(e.layout.recompute),
                                  ": the weaker modes do not fit the memory"));
  }
  if (e.layout.pp > 1) {
    plan.add_reasons(absl::StrFormat(
        "stages of %s blocks; pipeline bubble %.0f%% of the step; slowest stage %.0f%% above "
        "the mean",
        absl::StrJoin(e.blocks_per_stage, "/"), e.time.bubble_fraction * 100,
        (e.time.stage_imbalance - 1) * 100));
  }
}

uint64_t Bytes(double b) { return b > 0 ? static_cast<uint64_t>(std::llround(b)) : 0; }

}  // namespace

v1::PlanCalibration CalibrationFor(const planner::DeviceSpec& devices,
                                   const CalibrationByModel& calibrations) {
  const std::string key = planner::CalibrationKey(devices);
  if (auto it = calibrations.find(key); it != calibrations.end()) {
    v1::PlanCalibration c = it->second;
    c.set_device_model(key);
    return c;
  }
  v1::PlanCalibration c;
  c.set_device_model(key);
  c.set_compute_scale(1.0);
  c.set_comm_scale(1.0);
  c.set_optimizer_scale(1.0);
  return c;
}

planner::DeviceSpec Calibrated(planner::DeviceSpec devices,
                               const v1::PlanCalibration& calibration) {
  devices.efficiency = planner::ScaleEfficiency(
      devices.efficiency, calibration.compute_scale(), calibration.comm_scale(),
      calibration.optimizer_jobs() > 0 ? calibration.optimizer_scale() : 0.0);
  return devices;
}

std::string CalibrationReason(const v1::PlanCalibration& c) {
  const bool measured = absl::EndsWith(c.device_model(), "@measured");
  if (c.jobs() <= 0) {
    if (measured) {
      return absl::StrCat("efficiency: the figures the nodes measured (", c.device_model(),
                          "; no finished job calibrated them yet)");
    }
    return absl::StrCat("efficiency: the catalog's defaults for ", c.device_model(),
                        " (no finished job measured yet)");
  }
  std::string line = absl::StrFormat(
      "efficiency calibrated from %d finished job%s on %s: compute ×%.2f the %s "
      "prediction",
      c.jobs(), c.jobs() == 1 ? "" : "s", c.device_model(), c.compute_scale(),
      measured ? "measured figures'" : "catalog's");
  if (c.optimizer_jobs() > 0) {
    absl::StrAppend(&line, absl::StrFormat(", optimizer ×%.2f (%d job%s)", c.optimizer_scale(),
                                           c.optimizer_jobs(), c.optimizer_jobs() == 1 ? "" : "s"));
  }
  if (c.comm_jobs() > 0) {
    absl::StrAppend(&line, absl::StrFormat(", communication ×%.2f (%d job%s)", c.comm_scale(),
                                           c.comm_jobs(), c.comm_jobs() == 1 ? "" : "s"));
  }
  return line;
}

absl::StatusOr<planner::PlanRequest> PlanRequestFromSpec(const v1::JobSpec& spec,
                                                         const planner::DeviceSpec& cluster,
                                                         int top_k) {
  if (top_k < 0 || top_k > kMaxTopK) {
    return Invalid("top_k", absl::StrCat(top_k, " must be within [1, ", kMaxTopK, "]; omit it for ",
                                         kDefaultTopK));
  }
  planner::PlanRequest request;
  request.options.top_k = top_k == 0 ? kDefaultTopK : top_k;

  // Devices: the job's share of the cluster.
  const v1::ResourceSpec& resources = spec.resources();
  if (resources.gpus() < 0 || resources.cpu_devices() < 0) {
    return Invalid(resources.gpus() < 0 ? "spec.resources.gpus" : "spec.resources.cpu_devices",
                   "must be > 0 (the number of devices)");
  }
  if (resources.gpus() > 0 && resources.cpu_devices() > 0) {
    return Invalid("spec.resources", "asks for both gpus and cpu_devices; give exactly one");
  }
  const bool cluster_cpu = cluster.model == "cpu";
  const bool wants_gpu = resources.gpus() > 0;
  const bool wants_cpu = resources.cpu_devices() > 0;
  const char* field = cluster_cpu ? "spec.resources.cpu_devices" : "spec.resources.gpus";
  if (wants_gpu && cluster_cpu) {
    return Precondition("spec.resources.gpus",
                        "the cluster has only CPU devices; ask for cpu_devices instead");
  }
  if (wants_cpu && !cluster_cpu) {
    return Precondition("spec.resources.cpu_devices",
                        absl::StrCat("the cluster has ", cluster.model,
                                     " GPUs, not CPU devices; ask for gpus instead"));
  }
  const int count = wants_gpu   ? resources.gpus()
                    : wants_cpu ? resources.cpu_devices()
                                : cluster.count;
  if (count > cluster.count) {
    return Precondition(
        field, absl::StrCat(count, " requested but the cluster has ", DescribeDevices(cluster),
                            "; ask for at most ", cluster.count));
  }
  if (count > cluster.per_node && count % cluster.per_node != 0) {
    const int below = count / cluster.per_node * cluster.per_node;
    return Invalid(field,
                   absl::StrCat(count, " is not a whole number of nodes of ", cluster.per_node,
                                " devices; use ", below, " or ", below + cluster.per_node));
  }
  request.devices = cluster;
  request.devices.count = count;

  // Model and sequence length.
  ASSIGN_OR_RETURN(request.model, ModelFromSpec(spec.model()));
  const v1::TrainSpec& train = spec.train();
  if (train.seq_len() < 0 || train.seq_len() > request.model.seq_len) {
    return Invalid("spec.train.seq_len",
                   absl::StrCat(train.seq_len(), " must be within [1, ", request.model.seq_len,
                                "] (the model's seq_len); leave it out to use it"));
  }
  if (train.seq_len() > 0) request.model.seq_len = train.seq_len();

  // Precision, defaulting as the validator does.
  if (train.precision().empty()) {
    request.precision = cluster_cpu ? planner::Precision::kFp32 : planner::Precision::kBf16;
  } else {
    absl::StatusOr<planner::Precision> precision = planner::ParsePrecision(train.precision());
    if (!precision.ok()) {
      return Invalid("spec.train.precision", absl::StrCat("\"", train.precision(),
                                                          "\" is not a precision; use fp32 or "
                                                          "bf16"));
    }
    if (*precision == planner::Precision::kBf16 && cluster_cpu) {
      return Invalid("spec.train.precision", "bf16 needs GPUs; use fp32 on CPU devices");
    }
    request.precision = *precision;
  }

  // Constraints: the explicit parts of the layout.
  const v1::ParallelismSpec& p = spec.parallelism();
  const std::pair<const char*, int> sizes[] = {{"spec.parallelism.data", p.data()},
                                               {"spec.parallelism.tensor", p.tensor()},
                                               {"spec.parallelism.pipeline", p.pipeline()},
                                               {"spec.parallelism.micro_batch", p.micro_batch()}};
  for (const auto& [size_field, value] : sizes) {
    if (value < 0) return Invalid(size_field, absl::StrCat(value, " must be > 0"));
  }
  if (p.has_auto_() && (p.data() > 0 || p.tensor() > 0 || p.pipeline() > 0)) {
    return Invalid("spec.parallelism",
                   "give either auto or explicit data/tensor/pipeline sizes, not both");
  }
  if (p.data() > 0) request.fixed.dp = p.data();
  if (p.tensor() > 0) request.fixed.tp = p.tensor();
  if (p.pipeline() > 0) request.fixed.pp = p.pipeline();
  if (p.micro_batch() > 0) request.fixed.micro_batch = p.micro_batch();

  // Batch: the spec's, or the validator's default for the layout the spec names.
  const int64_t seq_len = request.model.seq_len;
  if (train.global_batch_tokens() < 0) {
    return Invalid("spec.train.global_batch_tokens",
                   absl::StrCat(train.global_batch_tokens(), " must be >= 0"));
  }
  if (train.global_batch_tokens() > 0) {
    const int64_t tokens = train.global_batch_tokens();
    if (tokens % seq_len != 0) {
      const int64_t below = tokens / seq_len * seq_len;
      return Invalid(
          "spec.train.global_batch_tokens",
          absl::StrCat(tokens, " is not a multiple of the sequence length ", seq_len, "; use ",
                       below > 0 ? absl::StrCat(below, " or ") : "", below + seq_len));
    }
    request.batch.global_batch_sequences = tokens / seq_len;
  } else {
    const int64_t model_parallel = int64_t{std::max(1, p.tensor())} * std::max(1, p.pipeline());
    const int64_t dp = p.data() > 0 ? p.data() : std::max<int64_t>(1, count / model_parallel);
    const int64_t mb = p.micro_batch();
    const int64_t per_rank =
        mb > 0 ? mb * ((kDefaultSequencesPerRank + mb - 1) / mb) : kDefaultSequencesPerRank;
    request.batch.global_batch_sequences = dp * per_rank;
  }
  return request;
}

v1::Layout LayoutFromEvaluation(const Evaluation& e) {
  v1::Layout layout;
  layout.set_data(e.layout.dp);
  layout.set_tensor(e.layout.tp);
  layout.set_pipeline(e.layout.pp);
  layout.set_micro_batch(e.layout.micro_batch);
  layout.set_num_micro_batches(e.layout.num_micro_batches);
  layout.set_recompute(std::string(planner::RecomputeName(e.layout.recompute)));
  layout.set_zero1(e.layout.zero1);
  layout.set_schedule(std::string(planner::ScheduleName(e.layout.schedule)));
  for (int blocks : e.blocks_per_stage) layout.add_blocks_per_stage(blocks);
  return layout;
}

v1::Plan PlanFromEvaluation(const Evaluation& e) {
  v1::Plan plan;
  *plan.mutable_layout() = LayoutFromEvaluation(e);
  plan.set_step_seconds(e.time.total);
  plan.set_tokens_per_second(e.tokens_per_second);
  plan.set_model_flops_per_device(e.model_flops_per_device);
  plan.set_mfu(e.mfu);
  const planner::MemoryBreakdown& m = e.peak_memory;
  v1::PlanMemory& memory = *plan.mutable_memory();
  memory.set_weights(Bytes(m.weights));
  memory.set_gradients(Bytes(m.gradients));
  memory.set_optimizer(Bytes(m.optimizer));
  memory.set_activations(Bytes(m.activations));
  memory.set_embedding_and_logits(Bytes(m.embedding_and_logits));
  memory.set_comm_buffers(Bytes(m.comm_buffers));
  memory.set_workspace(Bytes(m.workspace));
  memory.set_fragmentation(Bytes(m.fragmentation));
  memory.set_runtime_reserve(Bytes(m.runtime_reserve));
  memory.set_total(Bytes(m.total()));
  memory.set_device(Bytes(m.total() + e.headroom_bytes));
  memory.set_stage(e.peak_stage);
  v1::PlanPhases& phases = *plan.mutable_phases();
  phases.set_forward(e.time.forward);
  phases.set_backward(e.time.backward);
  phases.set_optimizer(e.time.optimizer);
  phases.set_comm_exposed(e.time.comm_exposed);
  phases.set_bubble(e.time.bubble);
  return plan;
}

v1::PlanJobResponse ResponseFromResult(const planner::PlanRequest& request,
                                       const planner::PlanResult& unconstrained,
                                       const planner::PlanResult* constrained,
                                       const v1::PlanCalibration* calibration) {
  v1::PlanJobResponse response;
  response.set_global_batch_sequences(unconstrained.global_batch_sequences);
  response.set_layouts_evaluated(unconstrained.layouts_evaluated +
                                 (constrained != nullptr ? constrained->layouts_evaluated : 0));
  response.set_devices(DescribeDevices(request.devices));
  const double best = unconstrained.ranked.empty() ? 0 : unconstrained.ranked.front().time.total;
  for (size_t i = 0; i < unconstrained.ranked.size(); ++i) {
    const Evaluation& e = unconstrained.ranked[i];
    v1::Plan& plan = *response.add_plans();
    plan = PlanFromEvaluation(e);
    if (i == 0) {
      plan.add_reasons(absl::StrCat("fastest predicted step of ", unconstrained.layouts_evaluated,
                                    " layouts evaluated"));
    } else {
      plan.add_reasons(Slower(e.time.total, best, "plan 1"));
    }
    AddCommonReasons(e, plan);
    if (calibration != nullptr) {
      *plan.mutable_calibration() = *calibration;
      if (i == 0) plan.add_reasons(CalibrationReason(*calibration));
    }
  }
  if (constrained != nullptr && !constrained->ranked.empty()) {
    const Evaluation& e = constrained->ranked.front();
    v1::Plan& plan = *response.mutable_constrained();
    plan = PlanFromEvaluation(e);
    plan.add_reasons("the best layout that honours the spec's parallelism");
    if (best > 0) plan.add_reasons(Slower(e.time.total, best, "the best unconstrained plan"));
    AddCommonReasons(e, plan);
    if (calibration != nullptr) {
      *plan.mutable_calibration() = *calibration;
      plan.add_reasons(CalibrationReason(*calibration));
    }
  }
  for (const planner::RejectedFamily& r : unconstrained.rejected) response.add_rejected(r.reason);
  return response;
}

absl::StatusOr<v1::PlanJobResponse> PlanJobOnDevices(const v1::JobSpec& spec,
                                                     const planner::DeviceSpec& cluster, int top_k,
                                                     const v1::PlanCalibration* calibration) {
  ASSIGN_OR_RETURN(
      planner::PlanRequest request,
      PlanRequestFromSpec(
          spec, calibration != nullptr ? Calibrated(cluster, *calibration) : cluster, top_k));
  if (!request.fixed.any()) {
    ASSIGN_OR_RETURN(planner::PlanResult result, planner::PlanLayouts(request));
    return ResponseFromResult(request, result, nullptr, calibration);
  }
  // The constrained search first: when the spec's own layout cannot run, that is the error.
  ASSIGN_OR_RETURN(planner::PlanResult constrained, planner::PlanLayouts(request));
  planner::PlanRequest free = request;
  free.fixed = planner::LayoutConstraints();
  ASSIGN_OR_RETURN(planner::PlanResult unconstrained, planner::PlanLayouts(free));
  return ResponseFromResult(request, unconstrained, &constrained, calibration);
}

absl::StatusOr<v1::PlanJobResponse> PlanJob(const v1::PlanJobRequest& request,
                                            const std::vector<v1::Node>& live_nodes,
                                            const CalibrationByModel& calibrations) {
  if (!request.has_spec()) {
    return absl::InvalidArgumentError(
        "spec is required: the job to plan, with at least model and resources");
  }
  const v1::JobSpec& spec = request.spec();
  planner::DeviceSpec cluster;
  if (request.has_cluster()) {
    ASSIGN_OR_RETURN(cluster, DevicesFromCluster(request.cluster()));
  } else {
    if (spec.resources().gpus() <= 0 && spec.resources().cpu_devices() <= 0) {
      return Invalid("spec.resources",
                     "no devices requested; set spec.resources.gpus or "
                     "spec.resources.cpu_devices, or describe a cluster to plan for all of it");
    }
    const v1::DeviceKind kind =
        spec.resources().gpus() > 0 ? v1::DEVICE_KIND_GPU : v1::DEVICE_KIND_CPU;
    ASSIGN_OR_RETURN(cluster, DevicesFromNodes(live_nodes, kind));
  }
  const v1::PlanCalibration calibration = CalibrationFor(cluster, calibrations);
  return PlanJobOnDevices(spec, cluster, request.top_k(), &calibration);
}

}  // namespace loom::planner_service
