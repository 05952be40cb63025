// A job's timeline (loom.v1.JobTrace) in the Chrome trace-event format, which Perfetto
// (ui.perfetto.dev) and chrome://tracing open.
//
// Layout of the file (docs/trace.md):
//   - one process per rank: pid = rank + 1, named "rank R (stage S, dp D, tp T) on nodes/N" by a
//     process_name metadata event and sorted by rank (process_sort_index);
//   - thread 1 of it ("steps") holds the rank's training thread: the step, data, forward and
//     backward per micro-batch, the waits and collectives, the optimizer, nested where they
//     nest (a tensor-parallel all-reduce inside its block's forward);
//   - thread 2 ("dp buckets (comm thread)") holds the gradient buckets' all-reduces, which run
//     on the communication thread while backward goes on (they overlap thread 1, so they need
//     a track of their own).
//   - complete events ("ph": "X") with ts and dur in microseconds since the earliest event
//     (the origin, in otherData.origin_unix_nanos: the ranks' CLOCK_REALTIME), args with step,
//     micro_batch (when per micro-batch), bytes (when any) and the stage, peer stage or bucket.
//
// Written as a stream, not built in memory: a trace may hold a million events.
#pragma once

#include <ostream>

#include "loom/v1/trace.pb.h"

namespace loom::client {

// Writes `trace` as one JSON object {"traceEvents": [...], "displayTimeUnit": "ms",
// "otherData": {...}}.
void WriteTraceEventJson(const loom::v1::JobTrace& trace, std::ostream& out);

// The event's name in the file ("forward", "pp_recv_activation", ...) and its category
// ("compute", "pp,wait", "dp", ...).
const char* TraceEventName(loom::v1::TraceEventKind kind);
const char* TraceEventCategory(loom::v1::TraceEventKind kind);

}  // namespace loom::client
