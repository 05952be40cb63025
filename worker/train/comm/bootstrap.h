// How a loom-train process finds the other ranks of its job and builds its communicators.
//
// Two ways to meet (docs/rank-contract.md):
//   - a file store: a directory shared by the ranks (--rendezvous-dir or LOOM_RENDEZVOUS_DIR),
//     for standalone multi-process runs; the store lives in DIR/<job>/gen-<generation>, so a
//     restarted gang never meets the addresses of the one before;
//   - loomd's RendezvousService (LOOM_RENDEZVOUS=host:port) when launched by loom-worker. Not
//     in this build yet: it plugs in at ConnectWorld, behind the same Communicator (the gRPC
//     client must stay out of the training core, so it will arrive as a Store implementation
//     supplied by the entry point).
#ifndef LOOM_WORKER_TRAIN_COMM_BOOTSTRAP_H_
#define LOOM_WORKER_TRAIN_COMM_BOOTSTRAP_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "worker/train/comm/communicator.h"

namespace loom::train {

struct RendezvousConfig {
  std::string job;           // LOOM_JOB; "standalone" when empty
  int64_t generation = 1;    // LOOM_JOB_GENERATION
  int rank = 0;              // LOOM_RANK
  int world_size = 1;        // LOOM_WORLD_SIZE
  std::string store_dir;     // --rendezvous-dir / LOOM_RENDEZVOUS_DIR
  std::string service;       // LOOM_RENDEZVOUS (loomd), not supported yet
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};  // LOOM_COMM_TIMEOUT_S
};

// True where this loom-train was built with a multi-process communicator (Gloo).
bool HaveMultiProcessComm();

// The directory of the file store of (job, generation) under `root`: root/<job with '/'
// replaced by '_'>/gen-<generation>.
std::string StoreDirFor(const std::string& root, const std::string& job, int64_t generation);

// The world communicator. A world of one needs no rendezvous (SingleRankCommunicator). Larger
// worlds meet through the file store. Throws InputError (exit 2) when no way to meet is
// configured or this build has no Gloo, CommError when the rendezvous fails or times out.
std::unique_ptr<Communicator> ConnectWorld(const RendezvousConfig& config);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_COMM_BOOTSTRAP_H_
