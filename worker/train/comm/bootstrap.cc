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

std::unique_ptr<Communicator> ConnectWorld(const RendezvousConfig& c) {
  if (c.world_size == 1) return std::make_unique<SingleRankCommunicator>();
  if (c.store_dir.empty()) {
    if (!c.service.empty()) {
      throw BadInput("LOOM_RENDEZVOUS",
                     "rendezvous through loomd is not in this loom-train yet; give the ranks a "
                     "shared directory with --rendezvous-dir or LOOM_RENDEZVOUS_DIR");
    }
    throw BadInput("LOOM_WORLD_SIZE", std::to_string(c.world_size) +
                                          " ranks need a rendezvous: set --rendezvous-dir or "
                                          "LOOM_RENDEZVOUS_DIR to a directory shared by the ranks");
  }
#ifdef LOOM_HAVE_GLOO
  GlooOptions o;
  o.rank = c.rank;
  o.size = c.world_size;
  o.store_dir = StoreDirFor(c.store_dir, c.job, c.generation);
  o.timeout = c.timeout;
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
