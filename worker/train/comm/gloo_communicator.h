// The Gloo implementation of Communicator: TCP between processes (or threads), for CPU ranks.
// Compiled only where CMake found Gloo (LOOM_HAVE_GLOO); this header names no Gloo type, so
// callers do not need Gloo's headers.
#ifndef LOOM_WORKER_TRAIN_COMM_GLOO_COMMUNICATOR_H_
#define LOOM_WORKER_TRAIN_COMM_GLOO_COMMUNICATOR_H_

#include <chrono>
#include <memory>
#include <string>

#include "worker/train/comm/communicator.h"
#include "worker/train/comm/key_value_store.h"

namespace loom::train {

struct GlooOptions {
  int rank = 0;
  int size = 1;
  // Where the ranks publish their TCP addresses, private to this group and generation: `store`
  // when set (e.g. loomd's RendezvousService; not owned, used only during ConnectGloo), else
  // `store_dir`, a directory every rank can read and write (one machine, or a shared file
  // system), as files.
  KeyValueStore* store = nullptr;
  std::string store_dir;
  // Scopes this group's keys in the store, so several groups (the world, and the tensor, data
  // and pipeline groups of a layout) can meet through one store. Ranks of one group use the same
  // name; distinct groups distinct names.
  std::string group = "world";
  // The address this rank listens on; 127.0.0.1 keeps a standalone world on one machine.
  std::string host = "127.0.0.1";
  // Rendezvous and every collective fail with CommError after this long (a dead peer must not
  // hang the gang).
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
};

// Meets the other size - 1 ranks through the store and connects a full TCP mesh. Blocks until
// all have arrived. Throws CommError after the timeout, naming the store and the ranks that never
// arrived ("rendezvous of 4 ranks timed out after 5 s in <store>: ranks 2, 3 never arrived"), or
// when the store or the TCP connections fail.
std::unique_ptr<Communicator> ConnectGloo(const GlooOptions& options);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_COMM_GLOO_COMMUNICATOR_H_
