// The bound on WorkerMessage.rank_statuses (proto/loom/v1/node.proto), shared by both ends of
// the node session: loom-worker puts at most this many statuses in one message, and loomd refuses
// a larger batch, so that one message cannot hold the job manager's lock for long.
#pragma once

namespace loom {

inline constexpr int kMaxRankStatusesPerBatch = 4096;

}  // namespace loom
