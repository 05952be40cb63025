// A key-value store with wait: the place where the ranks of one (job, generation) meet to
// exchange their addresses before the communicators connect (DESIGN.md, "Communication").
//
// The training core names only this interface; implementations that need libraries the core
// must not depend on (the gRPC client of loomd's RendezvousService,
// comm/grpc_rendezvous_store.h) live outside loom_train_core and are handed in by the entry
// point. The Gloo communicator adapts it to Gloo's own store type, and a NCCL bootstrap can use
// it for the unique id, so neither the store nor its users see the other's library.
//
// Threading: an implementation need not be thread-safe; one rank uses its store from one
// thread while it connects.
#ifndef LOOM_WORKER_TRAIN_COMM_KEY_VALUE_STORE_H_
#define LOOM_WORKER_TRAIN_COMM_KEY_VALUE_STORE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace loom::train {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;

  // Sets `key` to `value` (bytes), replacing any earlier value. Throws CommError when the store
  // cannot be reached within its own timeout or refuses the key.
  virtual void Set(const std::string& key, const std::string& value) = 0;

  // Blocks until every key in `keys` is set and returns their values in the same order. Throws
  // CommError when `timeout` passes first (the message names the missing keys where the store
  // knows them) or the store cannot be reached.
  virtual std::vector<std::string> Wait(const std::vector<std::string>& keys,
                                        std::chrono::milliseconds timeout) = 0;

  // Where the store lives, for error messages, e.g. "loomd at 10.0.0.1:7070 (jobs/x, gen 2)".
  virtual std::string Describe() const = 0;
};

// Opens the store of (`job`, `generation`) at `address` (host:port of loomd's
// RendezvousService); `timeout` bounds every call that does not carry its own. Does not block:
// an unreachable address shows at the first call, as CommError.
using KeyValueStoreFactory = std::function<std::unique_ptr<KeyValueStore>(
    const std::string& address, const std::string& job, int64_t generation,
    std::chrono::milliseconds timeout)>;

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_COMM_KEY_VALUE_STORE_H_
