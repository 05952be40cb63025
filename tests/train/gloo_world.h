// A world of Gloo ranks as threads of one test process, meeting through a temp file store: the
// harness of the communicator tests (comm_test.cc, comm_failure_test.cc).
#ifndef LOOM_TESTS_TRAIN_GLOO_WORLD_H_
#define LOOM_TESTS_TRAIN_GLOO_WORLD_H_

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/train/test_util.h"
#include "worker/train/comm/bootstrap.h"
#include "worker/train/comm/communicator.h"

namespace loom::train::testing {

// Runs body(rank, comm) on `n` threads, each with its own communicator of one world (the world
// communicator of ConnectWorld, so Gloo must be built in: callers skip otherwise). The ranks meet
// through a file store in a temporary directory unless `configure` changes the rendezvous (e.g.
// clears store_dir and sets a service store); it runs on each rank's config. An exception on any
// rank fails the test, naming the rank.
inline void RunGlooWorld(int n, std::chrono::milliseconds timeout,
                         const std::function<void(int, Communicator&)>& body,
                         const std::function<void(RendezvousConfig&)>& configure = {}) {
  TempDir dir;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        RendezvousConfig rc;
        rc.rank = r;
        rc.world_size = n;
        rc.store_dir = dir.path();
        rc.timeout = timeout;
        if (configure) configure(rc);
        std::unique_ptr<Communicator> c = ConnectWorld(rc);
        body(r, *c);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace loom::train::testing

#endif  // LOOM_TESTS_TRAIN_GLOO_WORLD_H_
