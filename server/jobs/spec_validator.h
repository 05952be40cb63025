// Job spec validation: checks a user's JobSpec against every rule of the API, fills every
// default (so the spec a rank reads is complete), and resolves the parallel layout.
//
// Errors name the field by its proto JSON path (e.g. `spec.resources.gpus`) and say how to fix
// it. INVALID_ARGUMENT: the spec is wrong whatever the cluster. FAILED_PRECONDITION: the spec is
// well formed but the cluster cannot run it now (too few devices, a path outside the
// operator's roots: SpecPolicy).
// Validation stops at the first error; INVALID_ARGUMENT rules are checked before any
// FAILED_PRECONDITION rule, so a spec that is wrong is reported as wrong.
//
// A pure function of its inputs: it never touches the file system (loomd never opens a user's
// file; loom-worker checks the data files on the node that reads them); thread-safe.
// Validating an already validated spec gives the same spec and layout back.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"

namespace loom::jobs {

// Devices of one kind over the registered READY nodes.
struct DeviceCapacity {
  int total = 0;         // devices of this kind on all ready nodes
  int max_per_node = 0;  // most devices of this kind on one ready node
};

// What the cluster could run if it were empty. Built from the node list by CapacityOf().
struct ClusterCapacity {
  DeviceCapacity gpu;
  DeviceCapacity cpu;
  int ready_nodes = 0;
};

// Sums the devices of the READY nodes among `nodes` (LOST nodes count for nothing).
ClusterCapacity CapacityOf(const std::vector<v1::Node>& nodes);

// The operator's confinement of spec paths (loomd's --data-roots and --checkpoint-roots), as
// normalised roots. An empty list allows any absolute path (syntactic checks only). Checkpoint
// roots are declared shared: visible at the same path on every node.
struct SpecPolicy {
  std::vector<std::string> data_roots;
  std::vector<std::string> checkpoint_roots;
};

struct ValidatedSpec {
  // The spec with every default filled in: name, model dimensions (also for a preset, whose
  // name is kept), train (global_batch_tokens, lr, precision, seed, min_lr_ratio, weight_decay,
  // grad_clip, seq_len), parallelism.micro_batch (and data/tensor/pipeline when explicit; an
  // `auto` spec keeps `auto` and leaves them 0: the decision is `layout`), restart.
  v1::JobSpec spec;
  // The layout the job runs with: data × tensor × pipeline = devices, and
  // global_batch_tokens = train.seq_len × data × micro_batch × num_micro_batches.
  v1::Layout layout;
  v1::DeviceKind device_kind = v1::DEVICE_KIND_UNSPECIFIED;  // GPU or CPU
  int devices = 0;                                           // gpus or cpu_devices
};

// Validates `spec` (see the file comment and proto/loom/v1/job.proto for the rules and
// defaults) against `capacity` and the path roots of `policy`. Spec paths come back normalised.
absl::StatusOr<ValidatedSpec> ValidateJobSpec(const v1::JobSpec& spec,
                                              const ClusterCapacity& capacity,
                                              const SpecPolicy& policy);

}  // namespace loom::jobs
