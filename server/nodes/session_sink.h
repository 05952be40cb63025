// SessionSink: the downward half of a worker's Session stream as the job manager sees it.
// The gRPC adapter implements it with a queue drained by the stream's writer; tests implement
// it with a vector that captures what loomd would have sent.
#pragma once

#include "loom/v1/node.pb.h"

namespace loom::nodes {

class SessionSink {
 public:
  virtual ~SessionSink() = default;

  // Queues `message` for the worker. Must not block (the manager calls it under its lock) and
  // must be thread-safe. Returns false when the session has already ended; the message is lost
  // then, which is safe: the worker reconciles on its next hello.
  virtual bool Send(const v1::CoordinatorMessage& message) = 0;

  // Ends the session from loomd's side (a newer session replaced it, the node was declared
  // LOST, or loomd shuts down). Idempotent; must not block.
  virtual void Close() = 0;
};

}  // namespace loom::nodes
