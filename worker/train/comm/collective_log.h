// CollectiveLog: how many collectives of each kind this process has issued, for the stack dump
// that loom-worker asks for when a job stops making progress (diag/stack_dump.h). Comparing the
// counts of the ranks of a hung gang shows which rank is behind (the one that did not issue the
// collective the others wait in).
//
// Contract: Note() is lock-free and may be called from any thread; Format() is async-signal-safe
// (no allocation, no locks): it writes into a caller's buffer.
#ifndef LOOM_WORKER_TRAIN_COMM_COLLECTIVE_LOG_H_
#define LOOM_WORKER_TRAIN_COMM_COLLECTIVE_LOG_H_

#include <cstddef>

namespace loom::train::collective_log {

enum Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier, kSend, kRecv, kKinds };

// Counts one collective of `kind` issued.
void Note(Kind kind);

// Writes "last collectives: all_reduce #12, reduce_scatter #0, ...\n" into `out` (at most
// `size` bytes, NUL-terminated) and returns its length.
size_t Format(char* out, size_t size);

}  // namespace loom::train::collective_log

#endif  // LOOM_WORKER_TRAIN_COMM_COLLECTIVE_LOG_H_
