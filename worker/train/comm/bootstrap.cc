#include "worker/train/comm/bootstrap.h"

#include <filesystem>

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

std::unique_ptr<Communicator> ConnectWorld(const RendezvousConfig& c) {
  if (c.world_size == 1) return std::make_unique<SingleRankCommunicator>();
  const bool use_service = c.store_dir.empty() && !c.service.empty();
  if (c.store_dir.empty() && c.service.empty()) {
    throw BadInput("LOOM_WORLD_SIZE", std::to_string(c.world_size) +
                                          " ranks need a rendezvous: set --rendezvous-dir or "
                                          "LOOM_RENDEZVOUS_DIR to a directory shared by the ranks");
  }
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
#ifdef LOOM_HAVE_GLOO
  GlooOptions o;
  o.rank = c.rank;
  o.size = c.world_size;
  o.timeout = c.timeout;
  if (use_service) {
    // Lives until ConnectGloo returns: the store is needed only while the ranks meet.
    std::unique_ptr<KeyValueStore> store =
        c.service_store(c.service, c.job, c.generation, c.timeout);
    o.store = store.get();
    return ConnectGloo(o);
  }
  o.store_dir = StoreDirFor(c.store_dir, c.job, c.generation);
  std::error_code ec;
  std::filesystem::create_directories(o.store_dir, ec);
  if (ec) throw BadInput(c.store_dir, "cannot create the rendezvous directory: " + ec.message());
  return ConnectGloo(o);
#else
  throw BadInput("LOOM_WORLD_SIZE", std::to_string(c.world_size) +
                                        " ranks need a communicator, and this loom-train was "
                                        "built without Gloo (a world of 1 works)");
#endif
}

}  // namespace loom::train
