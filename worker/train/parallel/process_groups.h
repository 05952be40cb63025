// The communication groups of a rank under a layout (DESIGN.md, "Layout"): rank order puts
// tensor fastest, then data, then pipeline, rank = tp + TP * (dp + DP * pp). Pure arithmetic;
// comm/bootstrap.h connects the groups.
//
//   world  every rank
//   tp     the TP ranks of one (pp, dp): the model's tensor-parallel all-reduces
//   dp     the DP ranks of one (pp, tp): gradient averaging, ZeRO-1
//   pp     the PP ranks of one (dp, tp): activations and gradients by send/recv; group rank =
//          the stage
//   emb    stage 0 and stage PP-1 of one (dp, tp), only when PP > 1: the tied embedding's
//          gradient (wte is held by both); group rank 0 = stage 0
#ifndef LOOM_WORKER_TRAIN_PARALLEL_PROCESS_GROUPS_H_
#define LOOM_WORKER_TRAIN_PARALLEL_PROCESS_GROUPS_H_

#include <memory>
#include <string>
#include <vector>

#include "worker/train/comm/communicator.h"
#include "worker/train/config/rank_env.h"

namespace loom::train {

// One group this rank belongs to.
struct GroupSpec {
  std::string name;  // unique per group instance across the world, e.g. "dp.pp1.tp0"
  int rank = 0;      // this rank's index in the group
  int size = 1;
  std::vector<int> members;  // world ranks, in group-rank order
};

// The groups of world rank `rank` (whose coordinates `shape` holds), in the order every rank
// creates them: world, tp, dp, pp, then emb when PP > 1 and this rank is on the first or the
// last stage (the emb groups are disjoint, so ranks that skip it do not block the others).
std::vector<GroupSpec> GroupsOf(const BatchShape& shape, int rank);

// The world rank of coordinates (dp, tp, pp) under `shape`'s sizes.
int WorldRank(const BatchShape& shape, int dp, int tp, int pp);

// A rank's communicators, one per dimension. A group of one is a SingleRankCommunicator; emb is
// null where this rank is in no embedding group. Destroyed in reverse order of creation.
struct ProcessGroups {
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> tp;
  std::unique_ptr<Communicator> dp;
  std::unique_ptr<Communicator> pp;
  std::unique_ptr<Communicator> emb;
  // The pipeline's gradients on a communicator of their own, where the transport matches
  // point-to-point messages by posting order rather than by tag (NCCL: one stream per
  // communicator, so a stage's activation sends and gradient receives on one stream would wait
  // for each other's peers in a cycle); null where pp carries both (Gloo, tags).
  std::unique_ptr<Communicator> pp_grad;

  // Single-rank groups for a world of one.
  static ProcessGroups Alone();
  // Aborts every group (e.g. when one collective failed), so no peer waits for a timeout.
  void AbortAll(const std::string& why);
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_PARALLEL_PROCESS_GROUPS_H_
