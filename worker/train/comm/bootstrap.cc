#include "worker/train/comm/bootstrap.h"

#include <filesystem>

#include "worker/train/comm/file_store.h"
#include "worker/train/error.h"
#ifdef LOOM_HAVE_GLOO
#include "worker/train/comm/gloo_communicator.h"
#endif

namespace loom::train {

bool HaveMultiProcessComm() {
#ifdef LOOM_HAVE_GLOO
  return true;
#else
  return false;
#endif
}

std::string StoreDirFor(const std::string& root, const std::string& job, int64_t generation) {
  std::string name = job.empty() ? "standalone" : job;
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  return root + "/" + name + "/gen-" + std::to_string(generation);
}

std::string DescribeRendezvous(const RendezvousConfig& c) {
  if (c.world_size == 1) return "nothing";
  if (!c.store_dir.empty()) {
    return "the file store in " + StoreDirFor(c.store_dir, c.job, c.generation);
  }
  return "loomd's RendezvousService at " + c.service + " (" + c.job + ", generation " +
         std::to_string(c.generation) + ")";
}

namespace {

// The checks of a store for a multi-rank rendezvous, whatever communicator then connects.
void CheckStore(const RendezvousConfig& c) {
  if (c.store_dir.empty() && c.service.empty()) {
    throw BadInput("LOOM_WORLD_SIZE", std::to_string(c.world_size) +
                                          " ranks need a rendezvous: set --rendezvous-dir or "
                                          "LOOM_RENDEZVOUS_DIR to a directory shared by the ranks");
  }
  const bool use_service = c.store_dir.empty();
  if (use_service && !c.service_store) {
    throw BadInput("LOOM_RENDEZVOUS",
                   "this loom-train was built without gRPC; use --rendezvous-dir (or "
                   "LOOM_RENDEZVOUS_DIR) with a directory shared by the ranks");
  }
  if (use_service && c.job.empty()) {
    // loomd scopes every key by job; without one the service would refuse every call.
    throw BadInput("LOOM_JOB", "rendezvous through loomd (LOOM_RENDEZVOUS=" + c.service +
                                   ") needs the job name; set LOOM_JOB=jobs/{job}");
  }
}

// The checks of a multi-rank rendezvous shared by ConnectWorld and ConnectGroups (Gloo).
void CheckRendezvous(const RendezvousConfig& c) {
  CheckStore(c);
#ifndef LOOM_HAVE_GLOO
  throw BadInput("LOOM_WORLD_SIZE", std::to_string(c.world_size) +
                                        " ranks need a communicator, and this loom-train was "
                                        "built without Gloo (a world of 1 works)");
#endif
}

#ifdef LOOM_HAVE_GLOO
// Connects one group: `store` (loomd's, already prefixed) when set, else the directory `dir`.
std::unique_ptr<Communicator> ConnectGroup(const RendezvousConfig& c, int rank, int size,
                                           KeyValueStore* store, const std::string& dir) {
  if (size == 1) return std::make_unique<SingleRankCommunicator>();
  GlooOptions o;
  o.rank = rank;
  o.size = size;
  o.timeout = c.timeout;
  o.host = c.host;
  if (store != nullptr) {
    o.store = store;
    return ConnectGloo(o);
  }
  o.store_dir = dir;
  std::error_code ec;
  std::filesystem::create_directories(o.store_dir, ec);
  if (ec) throw BadInput(c.store_dir, "cannot create the rendezvous directory: " + ec.message());
  return ConnectGloo(o);
}
#endif

}  // namespace

std::unique_ptr<Communicator> ConnectWorld(const RendezvousConfig& c) {
  if (c.world_size == 1) return std::make_unique<SingleRankCommunicator>();
  CheckRendezvous(c);
#ifdef LOOM_HAVE_GLOO
  if (c.store_dir.empty()) {
    // Lives until ConnectGloo returns: the store is needed only while the ranks meet.
    std::unique_ptr<KeyValueStore> store =
        c.service_store(c.service, c.job, c.generation, c.timeout);
    return ConnectGroup(c, c.rank, c.world_size, store.get(), "");
  }
  return ConnectGroup(c, c.rank, c.world_size, nullptr,
                      StoreDirFor(c.store_dir, c.job, c.generation));
#else
  return nullptr;  // CheckRendezvous threw
#endif
}

ProcessGroups ConnectGroups(const RendezvousConfig& c, const BatchShape& shape) {
  if (c.world_size == 1) return ProcessGroups::Alone();
  CheckRendezvous(c);
  ProcessGroups g;
#ifdef LOOM_HAVE_GLOO
  std::unique_ptr<KeyValueStore> service;
  if (c.store_dir.empty()) service = c.service_store(c.service, c.job, c.generation, c.timeout);
  const std::string root =
      c.store_dir.empty() ? std::string() : StoreDirFor(c.store_dir, c.job, c.generation);
  for (const GroupSpec& spec : GroupsOf(shape, c.rank)) {
    // The world keeps ConnectWorld's keys and directory; the others get their own.
    const bool is_world = spec.name == "world";
    std::unique_ptr<KeyValueStore> prefixed;
    if (service && !is_world)
      prefixed = std::make_unique<PrefixedStore>(service.get(), spec.name + "/");
    KeyValueStore* store = is_world ? service.get() : prefixed.get();
    std::unique_ptr<Communicator> comm =
        ConnectGroup(c, spec.rank, spec.size, store, is_world ? root : root + "/" + spec.name);
    if (spec.name == "world") {
      g.world = std::move(comm);
    } else if (spec.name.rfind("tp.", 0) == 0) {
      g.tp = std::move(comm);
    } else if (spec.name.rfind("dp.", 0) == 0) {
      g.dp = std::move(comm);
    } else if (spec.name.rfind("pp.", 0) == 0) {
      g.pp = std::move(comm);
    } else {
      g.emb = std::move(comm);
    }
  }
#endif
  return g;
}

std::unique_ptr<KeyValueStore> OpenRendezvousStore(const RendezvousConfig& c) {
  CheckStore(c);
  if (c.store_dir.empty()) return c.service_store(c.service, c.job, c.generation, c.timeout);
  const std::string dir = StoreDirFor(c.store_dir, c.job, c.generation);
  // Created here, so that a directory the rank cannot write is a clear exit 2 (as for Gloo).
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw BadInput(c.store_dir, "cannot create the rendezvous directory: " + ec.message());
  return std::make_unique<FileKeyValueStore>(dir);
}

void PrefixedStore::Set(const std::string& key, const std::string& value) {
  base_->Set(prefix_ + key, value);
}

std::vector<std::string> PrefixedStore::Wait(const std::vector<std::string>& keys,
                                             std::chrono::milliseconds timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& k : keys) full.push_back(prefix_ + k);
  return base_->Wait(full, timeout);
}

std::string PrefixedStore::Describe() const { return base_->Describe() + " [" + prefix_ + "]"; }

}  // namespace loom::train
