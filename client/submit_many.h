// `loomctl submit -f a.yaml -f b.yaml ...`: a sweep's specs submitted by one process over one
// connection. One CLI process per job costs its start, gRPC's start and a connection each (about
// 3 ms of CPU on a 2-core VM, docs/benchmarks.md); here those are paid once, the specs are read
// side by side, and the CreateJob calls overlap, so that loomd's group commit shares its syncs
// among them.
//
// Every spec is read and checked before anything is sent: one bad file is exit 2 and no job is
// created. Each job gets its own idempotency key: with --request-id ID, the i-th file (from 1)
// gets "ID-i", so that running the same command again returns the same jobs; otherwise a fresh
// random key each. A job the server refuses is reported on stderr naming its file, the others
// are still created; the exit code is then the first refusal's (exit_codes.h).
//
// Output: table, one line per file in the order given, the job's name (or nothing for a refused
// one); json/yaml, one document {"jobs": [...]} as `loomctl list` prints, in the same order.
#pragma once

#include "client/commands.h"

namespace loom::client {

// How many CreateJob calls are in flight at once.
inline constexpr int kSubmitConcurrency = 8;

// Submits every file of `args.files` (two or more). `args.wait` is refused (exit 2): follow the
// jobs with `loomctl get --wait` or `watch`.
int SubmitMany(CommandContext& ctx, const SubmitArgs& args);

}  // namespace loom::client
