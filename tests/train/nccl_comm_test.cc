// The NCCL communicator on device buffers: a world of one on device 0, and a world of N threads
// on N devices when the machine has several, every collective checked against a known result;
// ordering behind the compute stream; Abort; a peer that never joins a collective times out.
// Ranks as processes (comm_test_rank, a test role): a killed peer fails the survivor in time.
// Skipped (GTEST_SKIP) where there is no CUDA device (or too few for a world of several).
#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/train/child_process.h"
#include "tests/train/test_util.h"
#include "worker/train/comm/key_value_store.h"
#include "worker/train/comm/nccl_communicator.h"

namespace loom::train {
namespace {

using Clock = std::chrono::steady_clock;

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver / no device" error
    return 0;
  }
  return n;
}

#define SKIP_WITHOUT_DEVICES(n)                                                    \
  do {                                                                             \
    if (DeviceCount() < (n)) GTEST_SKIP() << "needs " << (n) << " CUDA device(s)"; \
  } while (0)

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// A device buffer of n floats, freed on destruction.
class DeviceFloats {
 public:
  explicit DeviceFloats(size_t n) : n_(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(float)) != cudaSuccess) p_ = nullptr;
  }
  ~DeviceFloats() {
    if (p_ != nullptr) cudaFree(p_);
  }
  float* get() const { return p_; }
  void Put(const std::vector<float>& v) {
    cudaMemcpy(p_, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice);
  }
  std::vector<float> Get() const {
    std::vector<float> v(n_);
    cudaMemcpy(v.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost);
    return v;
  }

 private:
  size_t n_;
  float* p_ = nullptr;
};

// An in-memory KeyValueStore shared by the threads of one test (a stand-in for loomd's).
class MemoryStore : public KeyValueStore {
 public:
  void Set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
    changed_.notify_all();
  }
  std::vector<std::string> Wait(const std::vector<std::string>& keys,
                                std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    const bool all = changed_.wait_for(lock, timeout, [&] {
      for (const std::string& k : keys) {
        if (!values_.count(k)) return false;
      }
      return true;
    });
    if (!all) throw CommError("missing keys");
    std::vector<std::string> out;
    for (const std::string& k : keys) out.push_back(values_[k]);
    return out;
  }
  std::string Describe() const override { return "memory store"; }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

// These two run without a device: the error paths before and at the first CUDA call.
TEST(NcclCommTest, MissingUniqueIdTimesOutNamingTheStore) {
  MemoryStore store;  // rank 0 never publishes
  NcclOptions o;
  o.rank = 1;
  o.size = 2;
  o.store = &store;
  o.timeout = std::chrono::milliseconds(200);
  try {
    ConnectNccl(o);
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "rank 1 of 2: rank 0's NCCL unique id did not arrive within 0.2 s in memory store"),
        std::string::npos)
        << e.what();
  }
}

TEST(NcclCommTest, NoDeviceIsACommErrorWithFileLineAndCudaMessage) {
  if (DeviceCount() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  try {
    ConnectNccl(NcclOptions{});
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("nccl_communicator.cc:"), std::string::npos) << m;
    EXPECT_NE(m.find("cuda"), std::string::npos) << m;  // the failing call, named
    std::printf("without a device: %s\n", m.c_str());
  }
}

TEST(NcclCommTest, WorldOfOneCollectivesOnDeviceBuffers) {
  SKIP_WITHOUT_DEVICES(1);
  NcclOptions o;
  o.timeout = std::chrono::seconds(30);
  std::unique_ptr<NcclCommunicator> c = ConnectNccl(o);
  ASSERT_EQ(c->size(), 1);
  ASSERT_EQ(c->rank(), 0);
  const size_t n = 1000;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = 0.5f * static_cast<float>(i) - 7.0f;
  DeviceFloats a(n), out(n);
  ASSERT_NE(a.get(), nullptr);
  a.Put(host);
  c->AllReduceSum(a.get(), n)->Wait();
  EXPECT_EQ(a.Get(), host);  // the sum over one rank
  out.Put(std::vector<float>(n, -1.0f));
  c->ReduceScatterSum(a.get(), out.get(), n)->Wait();
  EXPECT_EQ(out.Get(), host);
  out.Put(std::vector<float>(n, -1.0f));
  c->AllGather(a.get(), out.get(), n)->Wait();
  EXPECT_EQ(out.Get(), host);
  c->Broadcast(a.get(), n, 0)->Wait();
  EXPECT_EQ(a.Get(), host);
  c->Barrier()->Wait();
  // bf16 through the typed overload: 1.5 and -2 are exact in bf16.
  uint16_t* b = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&b), 4 * sizeof(uint16_t)));
  const uint16_t bits[4] = {0x3FC0, 0xC000, 0x3FC0, 0xC000};  // 1.5, -2, 1.5, -2
  CUDA_OK(cudaMemcpy(b, bits, sizeof(bits), cudaMemcpyHostToDevice));
  c->AllReduceSum(b, 4, DeviceDType::kBFloat16)->Wait();
  uint16_t back[4] = {};
  CUDA_OK(cudaMemcpy(back, b, sizeof(back), cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(back, bits, sizeof(bits)), 0);
  cudaFree(b);
}

TEST(NcclCommTest, StartsAfterTheComputeStreamsWork) {
  SKIP_WITHOUT_DEVICES(1);
  cudaStream_t compute = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  NcclOptions o;
  o.compute_stream = compute;
  std::unique_ptr<NcclCommunicator> c = ConnectNccl(o);
  const size_t n = 1 << 22;  // 16 MiB: a copy long enough to race if the order were wrong
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 977);
  DeviceFloats in(n), out(n);
  out.Put(std::vector<float>(n, -1.0f));
  // The input is produced on the compute stream; the host does not wait for it.
  std::vector<float> pinned_src = host;
  CUDA_OK(cudaMemcpyAsync(in.get(), pinned_src.data(), n * sizeof(float), cudaMemcpyHostToDevice,
                          compute));
  WorkHandle w = c->ReduceScatterSum(in.get(), out.get(), n);  // out := in, once in is ready
  // The result is consumed on the compute stream without a host wait.
  c->StreamWaitAll(compute);
  std::vector<float> got(n);
  CUDA_OK(
      cudaMemcpyAsync(got.data(), out.get(), n * sizeof(float), cudaMemcpyDeviceToHost, compute));
  CUDA_OK(cudaStreamSynchronize(compute));
  w->Wait();
  EXPECT_TRUE(w->Done());
  EXPECT_EQ(got, host);
  c.reset();
  cudaStreamDestroy(compute);
}

TEST(NcclCommTest, AbortFailsPendingAndLaterWork) {
  SKIP_WITHOUT_DEVICES(1);
  std::unique_ptr<NcclCommunicator> c = ConnectNccl(NcclOptions{});
  DeviceFloats a(16);
  c->AllReduceSum(a.get(), 16)->Wait();
  c->Abort("test abort");
  try {
    c->AllReduceSum(a.get(), 16)->Wait();
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("aborted: test abort"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c->Barrier()->Wait(), CommError);
}

// Runs body(rank, comm) on `n` threads, each with the communicator of device `rank`.
void RunDeviceWorld(int n, std::chrono::milliseconds timeout,
                    const std::function<void(int, NcclCommunicator&)>& body) {
  MemoryStore store;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        if (cudaSetDevice(r) != cudaSuccess) throw std::runtime_error("cudaSetDevice");
        NcclOptions o;
        o.rank = r;
        o.size = n;
        o.device = r;
        o.store = &store;
        o.timeout = timeout;
        std::unique_ptr<NcclCommunicator> c = ConnectNccl(o);
        body(r, *c);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(NcclCommTest, DeviceWorldCollectivesHaveKnownResults) {
  const int n = DeviceCount();
  if (n < 2) GTEST_SKIP() << "needs 2 or more CUDA devices (has " << n << ")";
  const size_t chunk = 257;
  RunDeviceWorld(n, std::chrono::seconds(60), [n, chunk](int r, NcclCommunicator& c) {
    ASSERT_EQ(c.rank(), r);
    // All-reduce: rank r holds (r + 1) * i.
    DeviceFloats a(chunk);
    std::vector<float> v(chunk);
    for (size_t i = 0; i < chunk; ++i) v[i] = static_cast<float>((r + 1) * i);
    a.Put(v);
    c.AllReduceSum(a.get(), chunk)->Wait();
    std::vector<float> sum = a.Get();
    for (size_t i = 0; i < chunk; ++i) ASSERT_EQ(sum[i], n * (n + 1) / 2.0f * i) << i;
    // Reduce-scatter of (n, chunk) rows i * (r + 1), then all-gather of rank ids.
    DeviceFloats in(n * chunk), out(chunk), all(n * chunk);
    std::vector<float> rows(n * chunk);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i * (r + 1));
    in.Put(rows);
    c.ReduceScatterSum(in.get(), out.get(), chunk)->Wait();
    std::vector<float> mine = out.Get();
    for (size_t j = 0; j < chunk; ++j) {
      ASSERT_EQ(mine[j], static_cast<float>((r * chunk + j) * (n * (n + 1) / 2))) << j;
    }
    out.Put(std::vector<float>(chunk, static_cast<float>(r)));
    c.AllGather(out.get(), all.get(), chunk)->Wait();
    std::vector<float> gathered = all.Get();
    for (int q = 0; q < n; ++q) ASSERT_EQ(gathered[q * chunk], static_cast<float>(q));
    // Broadcast from the last rank; a send/recv pair between ranks 0 and 1.
    a.Put(std::vector<float>(chunk, static_cast<float>(100 * r)));
    c.Broadcast(a.get(), chunk, n - 1)->Wait();
    ASSERT_EQ(a.Get()[chunk - 1], 100.0f * (n - 1));
    if (r == 0) {
      a.Put(std::vector<float>(chunk, 42.0f));
      c.Send(a.get(), chunk, 1, 0)->Wait();
    } else if (r == 1) {
      c.Recv(a.get(), chunk, 0, 0)->Wait();
      ASSERT_EQ(a.Get()[0], 42.0f);
    }
    // A ring exchange in one fused call: every rank sends right and receives from the left.
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    DeviceFloats mine_out(chunk), from_left(chunk);
    mine_out.Put(std::vector<float>(chunk, static_cast<float>(r + 1)));
    c.SendRecv(mine_out.get(), chunk, right, from_left.get(), chunk, left)->Wait();
    ASSERT_EQ(from_left.Get()[chunk - 1], static_cast<float>(left + 1));
    c.Barrier()->Wait();
  });
}

TEST(NcclCommTest, PeerThatNeverJoinsTimesOut) {
  const int n = DeviceCount();
  if (n < 2) GTEST_SKIP() << "needs 2 or more CUDA devices (has " << n << ")";
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  RunDeviceWorld(2, std::chrono::seconds(3), [&](int r, NcclCommunicator& c) {
    if (r == 1) {  // stays alive but never joins
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return done; });
      return;
    }
    DeviceFloats a(64);
    const Clock::time_point start = Clock::now();
    EXPECT_THROW(c.AllReduceSum(a.get(), 64)->Wait(), CommError);
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    EXPECT_GT(waited, 2.5);
    EXPECT_LT(waited, 6.0);
    EXPECT_THROW(c.Barrier()->Wait(), CommError);  // the communicator is aborted
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
    }
    cv.notify_all();
  });
}

// Ranks as processes (comm_test_rank --backend nccl, rank r on device r) meeting through a
// FileKeyValueStore: a healthy world computes every sum; when rank 1 SIGKILLs itself before a
// collective, rank 0's watchdog must fail that collective within the timeout and the process
// exit 1, whether NCCL notices the dead peer (an asynchronous error) or only the timeout does.
TEST(NcclProcessTest, KilledPeerFailsTheSurvivorWithinTheTimeout) {
  const int devices = DeviceCount();
  if (devices < 2) GTEST_SKIP() << "needs 2 or more CUDA devices (has " << devices << ")";
  const int timeout_ms = 5000;
  for (bool kill_one : {false, true}) {
    testing::TempDir dir;
    std::vector<pid_t> pids;
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> args = {LOOM_COMM_TEST_RANK_BIN,
                                       "--backend",
                                       "nccl",
                                       "--store",
                                       dir / "store",
                                       "--rank",
                                       std::to_string(r),
                                       "--size",
                                       "2",
                                       "--iterations",
                                       "20",
                                       "--timeout-ms",
                                       std::to_string(timeout_ms)};
      if (kill_one && r == 1) args.insert(args.end(), {"--die-at", "5"});
      pids.push_back(testing::Spawn(args, dir / ("rank" + std::to_string(r))));
    }
    std::vector<testing::Exit> exits = testing::WaitAll(pids, 120);
    const std::string err0 = testing::ReadText(dir / "rank0.err");
    if (!kill_one) {
      for (int r = 0; r < 2; ++r) {
        EXPECT_TRUE(testing::ExitedWith(exits[r], 0))
            << "rank " << r << ": "
            << testing::ReadText(dir / ("rank" + std::to_string(r) + ".err"));
      }
      EXPECT_NE(testing::ReadText(dir / "rank0.out").find("iteration 19 ok"), std::string::npos);
      continue;
    }
    ASSERT_TRUE(WIFSIGNALED(exits[1].status) && WTERMSIG(exits[1].status) == SIGKILL);
    EXPECT_TRUE(testing::ExitedWith(exits[0], 1)) << "status " << exits[0].status << ": " << err0;
    const double after = std::chrono::duration<double>(exits[0].when - exits[1].when).count();
    EXPECT_LT(after, timeout_ms / 1000.0 + 5.0) << err0;
    EXPECT_NE(testing::ReadText(dir / "rank0.out").find("iteration 4 ok"), std::string::npos);
    EXPECT_NE(err0.find("communication: nccl allreduce"), std::string::npos) << err0;
    std::printf("NCCL rank 0 failed %.3f s after rank 1 died: %s", after, err0.c_str());
  }
}

}  // namespace
}  // namespace loom::train
