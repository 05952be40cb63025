// The communicators: a world of one (always built) and Gloo over TCP (where CMake found Gloo),
// with N ranks as N threads of this process meeting through a file store in a temp directory.
// Every collective is checked against a known result; Abort must unblock a waiting Recv.
// The rendezvous through a KeyValueStore (the path of loomd's RendezvousService) is driven with
// an in-memory store, so the training core's side of it is tested without gRPC.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/train/gloo_world.h"
#include "tests/train/test_util.h"
#include "worker/train/comm/bootstrap.h"
#include "worker/train/comm/comm_thread.h"
#include "worker/train/comm/communicator.h"
#include "worker/train/comm/file_store.h"
#include "worker/train/comm/key_value_store.h"
#include "worker/train/error.h"
#include "worker/train/parallel/zero_optimizer.h"

namespace loom::train {
namespace {

using testing::TempDir;

TEST(SingleRankCommTest, CollectivesAreTheIdentity) {
  SingleRankCommunicator c;
  std::vector<float> x = {1.5f, -2.0f, 3.0f};
  c.AllReduceSum(x.data(), x.size())->Wait();
  EXPECT_EQ(x, (std::vector<float>{1.5f, -2.0f, 3.0f}));
  std::vector<float> out(3);
  c.ReduceScatterSum(x.data(), out.data(), 3)->Wait();
  EXPECT_EQ(out, x);
  c.AllGather(x.data(), out.data(), 3)->Wait();
  EXPECT_EQ(out, x);
  c.Broadcast(x.data(), 3, 0)->Wait();
  c.Barrier()->Wait();
  c.Abort("test");
  EXPECT_THROW(c.Barrier()->Wait(), CommError);
}

TEST(CommThreadTest, AFailureAbortsLaterOperationsOnlyWhenAsked) {
  for (bool poison : {false, true}) {
    CommThread t(poison);
    bool ran_after = false;
    WorkHandle first = t.Enqueue("first", [] { throw CommError("peer gone"); });
    WorkHandle second = t.Enqueue("second", [&ran_after] { ran_after = true; });
    try {
      first->Wait();
      FAIL() << "expected CommError";
    } catch (const CommError& e) {
      EXPECT_EQ(std::string(e.what()), "first: peer gone");
    }
    if (poison) {
      // Queued behind the failure, or issued after it: fails without running.
      try {
        second->Wait();
        FAIL() << "expected CommError";
      } catch (const CommError& e) {
        EXPECT_EQ(std::string(e.what()), "second: aborted: first: peer gone");
      }
      EXPECT_FALSE(ran_after);
      EXPECT_TRUE(t.aborted());
      EXPECT_THROW(t.Enqueue("third", [] {})->Wait(), CommError);
    } else {
      second->Wait();
      EXPECT_TRUE(ran_after);
      EXPECT_FALSE(t.aborted());
    }
  }
}

TEST(BootstrapTest, WorldOfOneNeedsNoRendezvous) {
  RendezvousConfig rc;
  auto c = ConnectWorld(rc);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(StoreDirFor("r", "jobs/a", 3), "r/jobs_a/gen-3");
  EXPECT_EQ(StoreDirFor("r", "", 1), "r/standalone/gen-1");
}

TEST(FileStoreTest, ValuesCrossInstancesWholeAndKeysStayDistinct) {
  TempDir dir;
  FileKeyValueStore a(dir / "store"), b(dir / "store");             // created by the first Set
  const std::string id = std::string("\0\x01", 2) + "binary\xff/";  // like a NCCL unique id
  a.Set("world/nccl-unique-id", id);
  a.Set("a/b", "slash");
  a.Set("a%2Fb", "escaped");
  a.Set(".hidden", "dot");
  EXPECT_EQ(
      b.Wait({"world/nccl-unique-id", "a/b", "a%2Fb", ".hidden"}, std::chrono::milliseconds(100)),
      (std::vector<std::string>{id, "slash", "escaped", "dot"}));
  a.Set("a/b", "replaced");
  EXPECT_EQ(b.Wait({"a/b"}, std::chrono::milliseconds(100)).at(0), "replaced");
  EXPECT_EQ(b.Describe(), "the file store in " + dir / "store");
}

TEST(FileStoreTest, WaitBlocksUntilSetAndNamesMissingKeysOnTimeout) {
  TempDir dir;
  FileKeyValueStore a(dir.path()), b(dir.path());
  std::thread setter([&a] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    a.Set("late", "here");
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(b.Wait({"late"}, std::chrono::seconds(10)).at(0), "here");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  setter.join();
  try {
    b.Wait({"late", "never/1", "never/2"}, std::chrono::milliseconds(50));
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("waiting for never/1, never/2 in the file store"),
              std::string::npos)
        << e.what();
  }
}

// The keys of every MemoryStore opened on one MemoryStoreData: a stand-in for loomd's store.
struct MemoryStoreData {
  std::mutex mu;
  std::condition_variable changed;
  std::map<std::string, std::string> values;
  std::vector<std::string> opened;  // "address job generation" per Open
};

class MemoryStore : public KeyValueStore {
 public:
  explicit MemoryStore(MemoryStoreData* data) : data_(data) {}
  void Set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(data_->mu);
    data_->values[key] = value;
    data_->changed.notify_all();
  }
  std::vector<std::string> Wait(const std::vector<std::string>& keys,
                                std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(data_->mu);
    const bool all = data_->changed.wait_for(lock, timeout, [&] {
      for (const std::string& k : keys) {
        if (!data_->values.count(k)) return false;
      }
      return true;
    });
    if (!all) throw CommError("missing keys");
    std::vector<std::string> out;
    for (const std::string& k : keys) out.push_back(data_->values[k]);
    return out;
  }
  std::string Describe() const override { return "memory store"; }

 private:
  MemoryStoreData* data_;
};

KeyValueStoreFactory MemoryStoreFactory(MemoryStoreData* data) {
  return [data](const std::string& address, const std::string& job, int64_t generation,
                std::chrono::milliseconds) -> std::unique_ptr<KeyValueStore> {
    std::lock_guard<std::mutex> lock(data->mu);
    data->opened.push_back(address + " " + job + " " + std::to_string(generation));
    return std::make_unique<MemoryStore>(data);
  };
}

TEST(BootstrapTest, ServiceWithoutAStoreFactoryIsAConfigurationError) {
  // A loom-train built without gRPC (LOOM_TRAIN_ONLY) has no factory.
  RendezvousConfig rc;
  rc.job = "jobs/a";
  rc.world_size = 2;
  rc.service = "127.0.0.1:1";
  try {
    ConnectWorld(rc);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("LOOM_RENDEZVOUS"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("built without gRPC; use --rendezvous-dir"),
              std::string::npos)
        << e.what();
  }
}

TEST(BootstrapTest, ServiceWithoutAJobIsAConfigurationError) {
  MemoryStoreData data;
  RendezvousConfig rc;
  rc.world_size = 2;
  rc.service = "127.0.0.1:1";
  rc.service_store = MemoryStoreFactory(&data);
  try {
    ConnectWorld(rc);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("LOOM_JOB"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(data.opened.empty());
}

TEST(BootstrapTest, ServiceStoreConnectsAGlooWorld) {
  if (!HaveMultiProcessComm()) GTEST_SKIP() << "built without Gloo";
  MemoryStoreData data;
  const int n = 3;
  testing::RunGlooWorld(
      n, std::chrono::seconds(30),
      [&](int, Communicator& c) {
        std::vector<float> x(10, 1.0f);
        c.AllReduceSum(x.data(), x.size())->Wait();
        for (float v : x) ASSERT_EQ(v, static_cast<float>(n));
      },
      [&](RendezvousConfig& rc) {
        rc.job = "jobs/j";
        rc.generation = 4;
        rc.store_dir.clear();
        rc.service = "loomd:7070";
        rc.service_store = MemoryStoreFactory(&data);
      });
  ASSERT_EQ(data.opened.size(), static_cast<size_t>(n));
  for (const std::string& o : data.opened) EXPECT_EQ(o, "loomd:7070 jobs/j 4");
  EXPECT_FALSE(data.values.empty());  // the addresses went through the store
}

TEST(BootstrapTest, AMissingPeerIsACommErrorNamingTheStore) {
  if (!HaveMultiProcessComm()) GTEST_SKIP() << "built without Gloo";
  MemoryStoreData data;
  RendezvousConfig rc;
  rc.job = "jobs/j";
  rc.world_size = 2;  // rank 1 never comes
  rc.service = "loomd:7070";
  rc.service_store = MemoryStoreFactory(&data);
  rc.timeout = std::chrono::milliseconds(300);
  try {
    ConnectWorld(rc);
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    // The store, and who is missing, by the arrival keys in it.
    EXPECT_NE(std::string(e.what()).find("rank 0: rendezvous of 2 ranks timed out after 0.3 s in "
                                         "memory store: rank 1 never arrived"),
              std::string::npos)
        << e.what();
    EXPECT_EQ(data.values.count("world/arrived/0"), 1u);
  }
}

// Runs body(rank, comm) on `n` Gloo ranks as threads (skipped without Gloo).
void RunWorld(int n, const std::function<void(int, Communicator&)>& body, int timeout_s = 30) {
  if (!HaveMultiProcessComm()) GTEST_SKIP() << "built without Gloo";
  testing::RunGlooWorld(n, std::chrono::seconds(timeout_s), body);
}

TEST(GlooCommTest, AllReduceSumsRankValues) {
  for (int n : {2, 3, 4}) {
    RunWorld(n, [n](int r, Communicator& c) {
      ASSERT_EQ(c.rank(), r);
      ASSERT_EQ(c.size(), n);
      // Several in flight at once: they complete in issue order on the comm thread.
      std::vector<float> a(1000), b(7);
      for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(r + 1) * i;
      for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(r * 10 + i);
      WorkHandle wa = c.AllReduceSum(a.data(), a.size());
      WorkHandle wb = c.AllReduceSum(b.data(), b.size());
      wb->Wait();
      wa->Wait();
      const float ranks_sum = n * (n + 1) / 2.0f;  // sum of r + 1
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], ranks_sum * i) << i;
      for (size_t i = 0; i < b.size(); ++i) {
        ASSERT_EQ(b[i], 10.0f * n * (n - 1) / 2 + n * static_cast<float>(i));
      }
    });
  }
}

TEST(GlooCommTest, ReduceScatterAndAllGatherShapes) {
  const int n = 3;
  const size_t chunk = 5;
  RunWorld(n, [&](int r, Communicator& c) {
    std::vector<float> in(n * chunk), out(chunk, -1.0f);  // in (n, chunk), out (chunk)
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i * (r + 1));
    c.ReduceScatterSum(in.data(), out.data(), chunk)->Wait();
    for (size_t j = 0; j < chunk; ++j) {
      ASSERT_EQ(out[j], static_cast<float>((r * chunk + j) * 6)) << j;  // 1 + 2 + 3 = 6
    }
    std::vector<float> mine(chunk, static_cast<float>(r)), all(n * chunk, -1.0f);  // (n, chunk)
    c.AllGather(mine.data(), all.data(), chunk)->Wait();
    for (int q = 0; q < n; ++q) {
      for (size_t j = 0; j < chunk; ++j) ASSERT_EQ(all[q * chunk + j], static_cast<float>(q));
    }
  });
}

// The ring reduce-scatter: known sums for 2, 3 and 4 ranks, chunks of one float, of an odd
// length and of a length that is no power of two, several in flight and interleaved with an
// all-reduce (distinct tags must keep their messages apart).
TEST(GlooCommTest, ReduceScatterKnownSumsForSeveralSizes) {
  for (int size : {2, 3, 4}) {
    RunWorld(size, [size](int r, Communicator& c) {
      const std::vector<size_t> chunks = {1, 7, 1000};
      std::vector<std::vector<float>> ins, outs;
      std::vector<WorkHandle> works;
      std::vector<float> between(5, static_cast<float>(r));
      for (size_t n : chunks) {
        std::vector<float> in(size * n);  // (size, n): block q goes to rank q
        for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((r + 1) * 1000 + i);
        ins.push_back(std::move(in));
        outs.emplace_back(n, -1.0f);
      }
      for (size_t k = 0; k < chunks.size(); ++k) {
        works.push_back(c.ReduceScatterSum(ins[k].data(), outs[k].data(), chunks[k]));
        if (k == 0) works.push_back(c.AllReduceSum(between.data(), between.size()));
      }
      for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->Wait();
      const float ranks_sum = size * (size + 1) / 2.0f;  // sum of r + 1
      for (size_t k = 0; k < chunks.size(); ++k) {
        const size_t n = chunks[k];
        for (size_t j = 0; j < n; ++j) {
          // sum over q of (q + 1) * 1000 + r * n + j, exact in fp32 at these magnitudes.
          const float want = 1000.0f * ranks_sum + size * static_cast<float>(r * n + j);
          ASSERT_EQ(outs[k][j], want) << "size " << size << " n " << n << " j " << j;
        }
        for (size_t i = 0; i < ins[k].size(); ++i) {  // the input is read only
          ASSERT_EQ(ins[k][i], static_cast<float>((r + 1) * 1000 + i));
        }
      }
      for (float v : between) ASSERT_EQ(v, size * (size - 1) / 2.0f);
    });
  }
}

// Rounding depends only on the ring's fixed order of additions, never on timing: values whose
// sums round repeat bit for bit across runs.
TEST(GlooCommTest, ReduceScatterIsDeterministic) {
  const int size = 4;
  const size_t n = 333;
  RunWorld(size, [&](int r, Communicator& c) {
    std::vector<float> in(size * n);
    for (size_t i = 0; i < in.size(); ++i) {
      in[i] = std::sin(static_cast<float>(i * 7 + r * 13)) * std::pow(10.0f, (i + r) % 7 - 3.0f);
    }
    std::vector<float> first(n), again(n);
    c.ReduceScatterSum(in.data(), first.data(), n)->Wait();
    for (int rep = 0; rep < 5; ++rep) {
      c.ReduceScatterSum(in.data(), again.data(), n)->Wait();
      ASSERT_EQ(std::memcmp(first.data(), again.data(), n * sizeof(float)), 0) << rep;
    }
    // Close to the sum in double (any order): the ring sums every block once from each rank.
    for (size_t j = 0; j < n; ++j) {
      double want = 0.0;
      for (int q = 0; q < size; ++q) {
        const size_t i = r * n + j;
        want += std::sin(static_cast<float>(i * 7 + q * 13)) * std::pow(10.0f, (i + q) % 7 - 3.0f);
      }
      ASSERT_NEAR(first[j], want, 1e-5 * (1.0 + std::abs(want))) << j;
    }
  });
}

// ZeRO-1's collectives on buffers that dp does not divide (a zero-padded tail) and with ranks
// whose range is empty: each rank gets the scaled sum of its range and nothing else changes;
// the gather then gives every rank the whole buffer.
TEST(GlooCommTest, ZeroRangesReduceScatterAndGatherWithPadding) {
  for (int size : {3, 4}) {
    RunWorld(size, [size](int r, Communicator& c) {
      for (size_t n : {size_t{2}, size_t{10}, size_t{13}}) {
        RangeGather zero(n, &c);
        const ZeroRange& z = zero.range();
        ASSERT_EQ(z.begin, std::min(n, z.shard * r));
        std::vector<float> grads(n);
        for (size_t i = 0; i < n; ++i) grads[i] = static_cast<float>((r + 1) * 100 + i);
        zero.ReduceScatter(grads.data(), 0.5f);
        const float ranks_sum = size * (size + 1) / 2.0f;  // sum of r + 1
        auto mean = [&](size_t i) { return 0.5f * (100.0f * ranks_sum + size * i); };
        for (size_t i = 0; i < n; ++i) {
          const bool mine = i >= z.begin && i < z.end;
          ASSERT_EQ(grads[i], mine ? mean(i) : static_cast<float>((r + 1) * 100 + i))
              << "size " << size << " n " << n << " i " << i;
        }
        std::vector<float> full(n, -1.0f);
        zero.Gather(grads.data() + z.begin, full.data());
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(full[i], mean(i)) << i;
      }
    });
  }
}

TEST(GlooCommTest, BroadcastFromEachRoot) {
  RunWorld(3, [](int r, Communicator& c) {
    for (int root = 0; root < 3; ++root) {
      std::vector<float> x(4, static_cast<float>(r * 100));
      c.Broadcast(x.data(), x.size(), root)->Wait();
      for (float v : x) ASSERT_EQ(v, root * 100.0f);
    }
  });
}

TEST(GlooCommTest, SendRecvPairsAndBarrier) {
  const int n = 4;
  RunWorld(n, [n](int r, Communicator& c) {
    // A ring exchange: everyone sends right and receives from the left at the same time,
    // which deadlocks unless both are posted before either is waited for.
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    std::vector<float> out(16, static_cast<float>(r)), in(16, -1.0f);
    WorkHandle s = c.Send(out.data(), out.size(), right, 7);
    WorkHandle v = c.Recv(in.data(), in.size(), left, 7);
    v->Wait();
    s->Wait();
    for (float x : in) ASSERT_EQ(x, static_cast<float>(left));
    // Two tags between the same pair stay apart.
    if (r == 0) {
      float a = 1.0f, b = 2.0f;
      c.Send(&b, 1, 1, 2)->Wait();
      c.Send(&a, 1, 1, 1)->Wait();
    } else if (r == 1) {
      float a = 0.0f, b = 0.0f;
      WorkHandle wa = c.Recv(&a, 1, 0, 1);
      WorkHandle wb = c.Recv(&b, 1, 0, 2);
      wa->Wait();
      wb->Wait();
      ASSERT_EQ(a, 1.0f);
      ASSERT_EQ(b, 2.0f);
    }
    c.Barrier()->Wait();
  });
}

TEST(GlooCommTest, AbortUnblocksAWaitingRecv) {
  RunWorld(
      2,
      [](int r, Communicator& c) {
        if (r == 1) {
          // Rank 0 never sends: the Recv would wait for the whole timeout without Abort.
          float x = 0.0f;
          WorkHandle w = c.Recv(&x, 1, 0, 99);
          std::thread aborter([&c] {
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            c.Abort("test abort");
          });
          auto start = std::chrono::steady_clock::now();
          EXPECT_THROW(w->Wait(), CommError);
          const double waited =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          EXPECT_LT(waited, 5.0);
          aborter.join();
          // Everything after an Abort fails at once.
          EXPECT_THROW(c.Barrier()->Wait(), CommError);
        }
      },
      /*timeout_s=*/20);
}

}  // namespace
}  // namespace loom::train
