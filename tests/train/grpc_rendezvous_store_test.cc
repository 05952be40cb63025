// The gRPC store of loomd's RendezvousService (worker/train/comm/grpc_rendezvous_store.h)
// against the real service (server/rpc/rendezvous_service.h over an unchecked
// RendezvousStore) in this process on a loopback port: set and wait, the (job, generation)
// scope and its secret, the errors a rank sees (a missing key, loomd unreachable, a secret of
// another scope), and a Gloo world whose threads meet through it via ConnectWorld, as ranks
// launched by loom-worker do.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdlib>
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

  // Opens the store as a rank of (job, generation) would: with that gang's secret in
  // LOOM_RENDEZVOUS_SECRET, as loom-worker sets it.
  std::unique_ptr<KeyValueStore> Open(const std::string& job, int64_t generation,
                                      const std::string& address = "") {
    UseSecretOf(job, generation);
    return OpenGrpcRendezvousStore(address.empty() ? address_ : address, job, generation,
                                   milliseconds(5000));
  }
  void UseSecretOf(const std::string& job, int64_t generation) {
    setenv("LOOM_RENDEZVOUS_SECRET", secrets_->SecretFor(job, generation).c_str(), 1);
  }

  std::unique_ptr<auth::RendezvousSecrets> secrets_ =
      auth::RendezvousSecrets::ForKey(std::string(32, 'k'));
  rendezvous::RendezvousStore store_{rendezvous::ScopeChecker()};
  rpc::RendezvousServiceImpl service_{&store_, secrets_.get()};
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(GrpcRendezvousStoreTest, SetThenWaitWithinOneScope) {
  auto a = Open("jobs/a", 1);
  auto b = Open("jobs/a", 1);
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
  auto gen1 = Open("jobs/a", 1);
  auto gen2 = Open("jobs/a", 2);
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

TEST_F(GrpcRendezvousStoreTest, ASecretOpensOnlyItsOwnScope) {
  auto mine = Open("jobs/a", 1);
  mine->Set("nccl-id", "secret bytes");
  // A rank of job b, or of an older generation of a, presents its own secret for a's scope.
  for (auto [job, generation] : {std::pair<std::string, int64_t>{"jobs/b", 1}, {"jobs/a", 2}}) {
    UseSecretOf(job, generation);
    auto intruder = OpenGrpcRendezvousStore(address_, "jobs/a", 1, milliseconds(2000));
    for (int attempt = 0; attempt < 2; ++attempt) {
      try {
        if (attempt == 0) {
          intruder->Wait({"nccl-id"}, milliseconds(500));
        } else {
          intruder->Set("nccl-id", "forged");
        }
        FAIL() << "a secret of " << job << "/" << generation << " opened jobs/a generation 1";
      } catch (const CommError& e) {
        EXPECT_NE(std::string(e.what()).find("PERMISSION_DENIED"), std::string::npos) << e.what();
      }
    }
  }
  // No secret at all.
  unsetenv("LOOM_RENDEZVOUS_SECRET");
  auto anonymous = OpenGrpcRendezvousStore(address_, "jobs/a", 1, milliseconds(2000));
  try {
    anonymous->Wait({"nccl-id"}, milliseconds(500));
    FAIL() << "no secret opened jobs/a";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("UNAUTHENTICATED"), std::string::npos) << e.what();
  }
  // The value is what its own gang wrote.
  EXPECT_EQ(Open("jobs/a", 1)->Wait({"nccl-id"}, milliseconds(500))[0], "secret bytes");
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
  UseSecretOf("jobs/gloo", 3);
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
