// The gRPC store of loomd's RendezvousService (worker/train/comm/grpc_rendezvous_store.h)
// against the real service (server/rpc/rendezvous_service.h over an unchecked
// RendezvousStore) in this process on a loopback port: set and wait, the (job, generation)
// scope, the errors a rank sees (a missing key, loomd unreachable), and a Gloo world whose
// threads meet through it via ConnectWorld, as ranks launched by loom-worker do.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/train/gloo_world.h"
#include "server/rendezvous/rendezvous_store.h"
#include "server/rpc/rendezvous_service.h"
#include "worker/train/comm/bootstrap.h"
#include "worker/train/comm/communicator.h"
#include "worker/train/comm/grpc_rendezvous_store.h"

namespace loom::train {
namespace {

using std::chrono::milliseconds;

class GrpcRendezvousStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  void TearDown() override {
    store_.Shutdown();  // wakes waiters, so the server can stop
    server_->Shutdown();
  }

  rendezvous::RendezvousStore store_{rendezvous::ScopeChecker()};
  rpc::RendezvousServiceImpl service_{&store_};
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(GrpcRendezvousStoreTest, SetThenWaitWithinOneScope) {
  auto a = OpenGrpcRendezvousStore(address_, "jobs/a", 1, milliseconds(5000));
  auto b = OpenGrpcRendezvousStore(address_, "jobs/a", 1, milliseconds(5000));
  a->Set("k1", std::string("v\0x", 3));  // bytes, not text
  std::thread later([&b] {
    std::this_thread::sleep_for(milliseconds(100));
    b->Set("k2", "two");
  });
  const std::vector<std::string> values = a->Wait({"k1", "k2"}, milliseconds(5000));
  later.join();
  ASSERT_EQ(values.size(), 2u);
  EXPECT_EQ(values[0], std::string("v\0x", 3));
  EXPECT_EQ(values[1], "two");
  EXPECT_EQ(a->Describe(), "loomd at " + address_ + " (jobs/a, generation 1)");
}

TEST_F(GrpcRendezvousStoreTest, AnotherGenerationDoesNotSeeTheKeysAndTimesOutNamingThem) {
  auto gen1 = OpenGrpcRendezvousStore(address_, "jobs/a", 1, milliseconds(5000));
  auto gen2 = OpenGrpcRendezvousStore(address_, "jobs/a", 2, milliseconds(5000));
  gen1->Set("world/0", "addr");
  const auto start = std::chrono::steady_clock::now();
  try {
    gen2->Wait({"world/0"}, milliseconds(300));
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("DEADLINE_EXCEEDED"), std::string::npos) << what;
    EXPECT_NE(what.find("world/0"), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_F(GrpcRendezvousStoreTest, UnreachableLoomdIsACommErrorThatSaysSo) {
  // Nothing listens on port 1 of loopback.
  auto s = OpenGrpcRendezvousStore("127.0.0.1:1", "jobs/a", 1, milliseconds(500));
  const auto start = std::chrono::steady_clock::now();
  try {
    s->Set("k", "v");
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot reach loomd's RendezvousService at 127.0.0.1:1"),
              std::string::npos)
        << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_F(GrpcRendezvousStoreTest, GlooWorldMeetsThroughTheService) {
  if (!HaveMultiProcessComm()) GTEST_SKIP() << "built without Gloo";
  testing::RunGlooWorld(
      2, std::chrono::seconds(30),
      [](int r, Communicator& c) {
        std::vector<float> x(100, static_cast<float>(r + 1));
        c.AllReduceSum(x.data(), x.size())->Wait();
        for (float v : x) ASSERT_EQ(v, 3.0f);
      },
      [&](RendezvousConfig& rc) {
        rc.job = "jobs/gloo";
        rc.generation = 3;
        rc.store_dir.clear();
        rc.service = address_;
        rc.service_store = &OpenGrpcRendezvousStore;
      });
}

}  // namespace
}  // namespace loom::train
