#include "worker/train/parallel/process_groups.h"

#include "worker/train/error.h"

namespace loom::train {

int WorldRank(const BatchShape& s, int dp, int tp, int pp) {
  return tp + s.tp_size * (dp + s.dp_size * pp);
}

std::vector<GroupSpec> GroupsOf(const BatchShape& s, int rank) {
  LOOM_CHECK(WorldRank(s, s.dp_rank, s.tp_rank, s.pp_rank) == rank,
             "the batch shape's coordinates do not match the world rank");
  const std::string at_dp = ".dp" + std::to_string(s.dp_rank);
  const std::string at_tp = ".tp" + std::to_string(s.tp_rank);
  const std::string at_pp = ".pp" + std::to_string(s.pp_rank);
  std::vector<GroupSpec> groups;
  GroupSpec world{"world", rank, s.tp_size * s.dp_size * s.pp_size, {}};
  for (int r = 0; r < world.size; ++r) world.members.push_back(r);
  groups.push_back(world);

  GroupSpec tp{"tp" + at_pp + at_dp, s.tp_rank, s.tp_size, {}};
  for (int t = 0; t < s.tp_size; ++t) tp.members.push_back(WorldRank(s, s.dp_rank, t, s.pp_rank));
  groups.push_back(tp);

  GroupSpec dp{"dp" + at_pp + at_tp, s.dp_rank, s.dp_size, {}};
  for (int d = 0; d < s.dp_size; ++d) dp.members.push_back(WorldRank(s, d, s.tp_rank, s.pp_rank));
  groups.push_back(dp);

  GroupSpec pp{"pp" + at_dp + at_tp, s.pp_rank, s.pp_size, {}};
  for (int p = 0; p < s.pp_size; ++p) pp.members.push_back(WorldRank(s, s.dp_rank, s.tp_rank, p));
  groups.push_back(pp);

  if (s.pp_size > 1 && (s.pp_rank == 0 || s.pp_rank == s.pp_size - 1)) {
    GroupSpec emb{"emb" + at_dp + at_tp, s.pp_rank == 0 ? 0 : 1, 2, {}};
    emb.members = {WorldRank(s, s.dp_rank, s.tp_rank, 0),
                   WorldRank(s, s.dp_rank, s.tp_rank, s.pp_size - 1)};
    groups.push_back(emb);
  }
  return groups;
}

ProcessGroups ProcessGroups::Alone() {
  ProcessGroups g;
  g.world = std::make_unique<SingleRankCommunicator>();
  g.tp = std::make_unique<SingleRankCommunicator>();
  g.dp = std::make_unique<SingleRankCommunicator>();
  g.pp = std::make_unique<SingleRankCommunicator>();
  return g;
}

void ProcessGroups::AbortAll(const std::string& why) {
  for (Communicator* c : {pp_grad.get(), emb.get(), pp.get(), dp.get(), tp.get(), world.get()}) {
    if (c != nullptr) c->Abort(why);
  }
}

}  // namespace loom::train
