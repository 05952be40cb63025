// Where a job's checkpoints land decides where its ranks may run, and what a restart can find.
//
// A checkpoint of a tensor- or pipeline-parallel layout, or of ZeRO-1, is written as shards by
// several ranks, then published by rank 0 once every shard is there (docs/rank-contract.md).
// With the default checkpoint dir (a folder of the job in each worker's work dir, private to
// its node) the shards of ranks on different nodes never meet, and the job would train to its
// first checkpoint and fail there. Data parallelism alone with periodic checkpoints has the same
// limit at its first restart: rank 0's node holds the checkpoint, the other nodes do not, and
// ranks that see different checkpoints refuse to start. loomd therefore keeps such a job on one
// node (the scheduler gets the whole job as one group, so it places it on a single node) and
// refuses it at create when no node can hold it, naming spec.checkpoint.dir. A spec that sets
// checkpoint.dir says the dir is visible to every rank (a shared file system under
// --checkpoint-roots), and its ranks may span nodes.
//
// A restarted gang that does not find the newest checkpoint its job had committed (a failover to
// another node with node-local checkpoints) is never silent: ResumeNotice describes what happened
// for the job's events.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "loom/v1/job.pb.h"

namespace loom::jobs {

// Whether several ranks write shards of each checkpoint (tp > 1, pp > 1 or ZeRO-1 with dp > 1).
bool WritesShardedCheckpoints(const v1::Layout& layout);

// The scheduler's group size for the job (gang_scheduler.h keeps a group on one node): the whole
// world when its sharded checkpoints go to node-local dirs, else the tensor-parallel size.
int PlacementGroup(const v1::JobSpec& spec, const v1::Layout& layout);

// FAILED_PRECONDITION naming spec.checkpoint.dir when the job must stay on one node but needs
// more devices than the largest ready node has (`max_devices_per_node` of its kind).
absl::Status CheckCheckpointPlacement(const v1::JobSpec& spec, const v1::Layout& layout,
                                      int max_devices_per_node);

// The newest checkpoint step a job had certainly committed when its earlier gangs reported
// `reached` steps with a checkpoint every `every_steps` (0: none before the end): a multiple of
// every_steps strictly below `reached` (a later step was reported after it was written).
int64_t CommittedCheckpointStep(int64_t reached, int64_t every_steps);

// For the first step `first_step` reported by generation `generation` (> 1) of a job whose earlier
// generations reached `reached`: one line for the job's events saying where the gang resumed and,
// when it is below the committed checkpoint, that the checkpoint was not found and what to do.
// nullopt when there is nothing to say (generation 1, or no step was lost).
std::optional<std::string> ResumeNotice(const v1::JobSpec& spec, int64_t generation,
                                        int64_t first_step, int64_t reached);

}  // namespace loom::jobs
