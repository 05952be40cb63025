// The bound on WorkerMessage.rank_statuses (proto/loom/v1/node.proto), shared by both ends of
// the node session: loom-worker puts at most this many statuses in one message, and loomd refuses
// a larger batch, so that one message cannot hold the job manager's lock for long.
#pragma once

#include <cstddef>

namespace loom {

inline constexpr int kMaxRankStatusesPerBatch = 4096;

// loom-worker also ends a batch before it passes this size, well below loomd's receive limit
// (4 MiB by default): a message loomd refuses for its size would break the session, and the
// batch would be sent again after the reconnect.
inline constexpr size_t kMaxRankStatusBatchBytes = 1 << 20;

}  // namespace loom
