// RankEventSink: where the supervisor sends what the ranks do. The session client's outbound
// buffer implements it in the worker; tests implement it with a recorder.
#pragma once

#include <vector>

#include "loom/v1/node.pb.h"

namespace loom::worker {

class RankEventSink {
 public:
  virtual ~RankEventSink() = default;

  // Each is called on the supervisor's loop thread, in the order the events happened (for one
  // rank: STARTING, RUNNING, its logs and steps, then EXITED last). Implementations must be
  // quick and must not call back into the Supervisor.
  virtual void OnRankStatus(const loom::v1::RankStatus& status) = 0;
  // Several statuses that happened together (a gang's start, the exits found in one pass), in
  // their order. The default hands them to OnRankStatus one by one.
  virtual void OnRankStatuses(std::vector<loom::v1::RankStatus> statuses) {
    for (const loom::v1::RankStatus& status : statuses) OnRankStatus(status);
  }
  virtual void OnStepReport(const loom::v1::StepReport& report) = 0;
  virtual void OnLogChunk(const loom::v1::LogChunk& chunk) = 0;
  // A rank's answer to DumpStacks (after the log lines of its dump).
  virtual void OnStackDump(const loom::v1::StackDump& dump) = 0;
};

}  // namespace loom::worker
