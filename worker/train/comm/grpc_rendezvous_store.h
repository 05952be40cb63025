// The KeyValueStore of loomd's RendezvousService (proto/loom/v1/rendezvous.proto): a gRPC
// client whose every key lives in the scope (job, generation) of the rank's job, so a restarted
// gang never reads what the previous one wrote.
//
// Library loom_train_grpc_rendezvous, outside the training core: only loom-train's entry point
// (main.cc) links it, and it is not built with LOOM_TRAIN_ONLY. This header names no gRPC or
// protobuf type, so the entry point needs neither's headers either.
#ifndef LOOM_WORKER_TRAIN_COMM_GRPC_RENDEZVOUS_STORE_H_
#define LOOM_WORKER_TRAIN_COMM_GRPC_RENDEZVOUS_STORE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "worker/train/comm/key_value_store.h"

namespace loom::train {

// Opens the store of (`job`, `generation`) at `address` (host:port): TLS verified against
// LOOM_TLS_CA when set, else plaintext (loomd with --insecure on loopback); every call presents
// LOOM_RENDEZVOUS_SECRET, the gang's secret, without which loomd refuses the scope. A KeyValueStoreFactory. Does not block or
// connect: the first call does, waiting up to `timeout` for loomd to become reachable.
//
// Errors (all CommError, so loom-train exits 1 and loomd restarts the gang): loomd not reachable
// within `timeout` (the message says so and names the address); a Wait whose keys are not all
// set within its timeout (loomd's message names the missing keys); the scope refused (the job
// ended or moved to a newer generation: this rank is stale). UNAVAILABLE during a call (loomd
// restarting) is retried until the call's deadline, since Set and Wait are idempotent.
//
// Threading: the store may be used from one thread at a time.
std::unique_ptr<KeyValueStore> OpenGrpcRendezvousStore(const std::string& address,
                                                       const std::string& job, int64_t generation,
                                                       std::chrono::milliseconds timeout);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_COMM_GRPC_RENDEZVOUS_STORE_H_
