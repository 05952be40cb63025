// How a loom-train process finds the other ranks of its job and builds its communicators.
//
// Two ways to meet (docs/rank-contract.md):
//   - a file store: a directory shared by the ranks (--rendezvous-dir or LOOM_RENDEZVOUS_DIR),
//     for standalone multi-process runs; the store lives in DIR/<job>/gen-<generation>, so a
//     restarted gang never meets the addresses of the one before;
//   - loomd's RendezvousService (LOOM_RENDEZVOUS=host:port) when launched by loom-worker, in
//     the scope (LOOM_JOB, LOOM_JOB_GENERATION). The gRPC client must stay out of the training
//     core (it builds without gRPC), so the entry point hands in a KeyValueStoreFactory
//     (RendezvousConfig::service_store) where loom-train was built with it.
// The file store wins when both are given, so a user can override loomd's rendezvous.
#ifndef LOOM_WORKER_TRAIN_COMM_BOOTSTRAP_H_
#define LOOM_WORKER_TRAIN_COMM_BOOTSTRAP_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "worker/train/comm/communicator.h"
#include "worker/train/comm/key_value_store.h"
#include "worker/train/parallel/process_groups.h"

namespace loom::train {

struct RendezvousConfig {
  std::string job;         // LOOM_JOB; "standalone" when empty
  int64_t generation = 1;  // LOOM_JOB_GENERATION
  int rank = 0;            // LOOM_RANK
  int world_size = 1;      // LOOM_WORLD_SIZE
  std::string store_dir;   // --rendezvous-dir / LOOM_RENDEZVOUS_DIR
  std::string service;     // LOOM_RENDEZVOUS (host:port of loomd)
  // LOOM_COMM_HOST: the address this rank's Gloo contexts listen on and advertise to the others.
  // 127.0.0.1 keeps a world on one machine; ranks on several nodes need the node's address on
  // the cluster network (loom-worker passes LOOM_COMM_HOST on from its own environment).
  std::string host = "127.0.0.1";
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};  // LOOM_COMM_TIMEOUT_S
  // Opens loomd's store for `service`; empty where this loom-train was built without gRPC.
  KeyValueStoreFactory service_store;
};

// True where this loom-train was built with a multi-process communicator (Gloo).
bool HaveMultiProcessComm();

// The directory of the file store of (job, generation) under `root`: root/<job with '/'
// replaced by '_'>/gen-<generation>.
std::string StoreDirFor(const std::string& root, const std::string& job, int64_t generation);

// How the ranks of `config` meet, for the log: "the file store in DIR" or "loomd's
// RendezvousService at HOST:PORT (jobs/x, generation G)"; "nothing" for a world of one.
std::string DescribeRendezvous(const RendezvousConfig& config);

// The world communicator. A world of one needs no rendezvous (SingleRankCommunicator). Larger
// worlds meet through the file store, else through loomd. Throws InputError (exit 2) when no
// way to meet is configured or built in (no Gloo; LOOM_RENDEZVOUS without gRPC; LOOM_RENDEZVOUS
// without LOOM_JOB), CommError (exit 1, retryable) when the rendezvous fails, loomd cannot be
// reached or the peers do not all arrive within the timeout.
std::unique_ptr<Communicator> ConnectWorld(const RendezvousConfig& config);

// Every communicator of this rank under `shape` (parallel/process_groups.h), created in the
// same order on every rank. The world meets as ConnectWorld does; every other group meets
// through the same store under its own prefix (a subdirectory named after the group for the
// file store, a "<group>/" key prefix in loomd's store), so the scope (job, generation) still
// separates restarts. Groups of one rank need no rendezvous. Throws as ConnectWorld.
ProcessGroups ConnectGroups(const RendezvousConfig& config, const BatchShape& shape);

// The store of (job, generation) that the ranks of `config` meet in, for communicators that
// bootstrap through a KeyValueStore alone and need no Gloo (NCCL's unique id,
// comm/nccl_communicator.h): the file store in StoreDirFor(store_dir, job, generation), created
// if needed, or else loomd's (service_store), as ConnectWorld chooses. Throws InputError (exit
// 2) as ConnectWorld when no way to meet is configured or built in (no store directory and no
// LOOM_RENDEZVOUS; LOOM_RENDEZVOUS without gRPC or without LOOM_JOB; a store directory that
// cannot be created). Does not block: an unreachable loomd shows at the first call (CommError).
std::unique_ptr<KeyValueStore> OpenRendezvousStore(const RendezvousConfig& config);

// A store whose keys are `prefix` + key in `base` (not owned; outlives this).
class PrefixedStore : public KeyValueStore {
 public:
  PrefixedStore(KeyValueStore* base, std::string prefix)
      : base_(base), prefix_(std::move(prefix)) {}
  void Set(const std::string& key, const std::string& value) override;
  std::vector<std::string> Wait(const std::vector<std::string>& keys,
                                std::chrono::milliseconds timeout) override;
  std::string Describe() const override;

 private:
  KeyValueStore* base_;
  std::string prefix_;
};

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_COMM_BOOTSTRAP_H_
