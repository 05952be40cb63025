#include "tests/gpu/emu/thread_nccl.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "tests/gpu/bf16_bits.h"

namespace loom::emu {
namespace {

std::mutex turn;

using gpu_check::Bf16BitsToFloat;
using gpu_check::FloatToBf16Bits;

std::chrono::seconds Timeout() {
  const char* v = std::getenv("LOOM_EMU_NCCL_TIMEOUT_S");
  const int s = v != nullptr ? std::atoi(v) : 0;
  return std::chrono::seconds(s > 0 ? s : 120);
}

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "thread_nccl: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace

void TakeTurn() { turn.lock(); }
void GiveTurn() { turn.unlock(); }

struct ThreadGroup {
  explicit ThreadGroup(int n) : size(n), in(n), out(n), what(n) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  // The collective in progress: who arrived, with what.
  int arrived = 0;
  uint64_t generation = 0;  // completed collectives
  std::vector<const void*> in;
  std::vector<void*> out;
  std::vector<std::string> what;  // each rank's "kind n type root", which must agree
  // Messages in flight: (src, dst) -> bytes, in posting order.
  std::map<std::pair<int, int>, std::deque<std::vector<char>>> mail;
};

namespace {

std::mutex registry_mu;
std::map<std::string, std::weak_ptr<ThreadGroup>>& Registry() {
  static auto* r = new std::map<std::string, std::weak_ptr<ThreadGroup>>();
  return *r;
}

// Waits on g.cv (g.mu held through `lock`) until `done`, without the turn; aborts after the
// timeout naming `what`.
template <typename Done>
void WaitWithoutTurn(ThreadGroup& g, std::unique_lock<std::mutex>& lock, const std::string& what,
                     Done done) {
  GiveTurn();
  if (!g.cv.wait_for(lock, Timeout(), done)) {
    Fail(what +
         ": the peers did not arrive within the timeout (LOOM_EMU_NCCL_TIMEOUT_S); the "
         "ranks' communication orders differ");
  }
  lock.unlock();
  TakeTurn();
  lock.lock();
}

}  // namespace

ThreadNccl::ThreadNccl(const std::string& group, int rank, int size)
    : name_(group), rank_(rank), size_(size) {
  if (size < 1 || rank < 0 || rank >= size) Fail("bad rank or size for group " + group);
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    std::weak_ptr<ThreadGroup>& slot = Registry()[group];
    group_ = slot.lock();
    if (!group_) {
      group_ = std::make_shared<ThreadGroup>(size);
      slot = group_;
    }
  }
  if (group_->size != size) Fail("group " + group + " joined with two sizes");
  if (cudaStreamCreate(&stream_) != cudaSuccess) Fail("cudaStreamCreate");
}

ThreadNccl::~ThreadNccl() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void ThreadNccl::Abort(const std::string& why) {
  Fail("group " + name_ + " aborted by rank " + std::to_string(rank_) + ": " + why);
}

train::WorkHandle ThreadNccl::Collective(Kind kind, const void* in, void* out, size_t n,
                                         train::DeviceDType type, int root) {
  ThreadGroup& g = *group_;
  const size_t elem = type == train::DeviceDType::kBFloat16 ? 2 : 4;
  std::unique_lock<std::mutex> lock(g.mu);
  const uint64_t generation = g.generation;
  g.in[rank_] = in;
  g.out[rank_] = out;
  g.what[rank_] = std::to_string(static_cast<int>(kind)) + " n=" + std::to_string(n) +
                  " elem=" + std::to_string(elem) + " root=" + std::to_string(root);
  if (++g.arrived < g.size) {
    WaitWithoutTurn(g, lock, "collective " + g.what[rank_] + " of group " + name_,
                    [&] { return g.generation != generation; });
    return train::CompletedWork();
  }
  // The last to arrive combines, in rank order.
  for (int r = 1; r < g.size; ++r) {
    if (g.what[r] != g.what[0]) {
      Fail("group " + name_ + ": rank 0 called " + g.what[0] + ", rank " + std::to_string(r) +
           " called " + g.what[r]);
    }
  }
  const int S = g.size;
  auto value = [&](int r, size_t i) {  // rank r's input element i, as float
    return elem == 2 ? Bf16BitsToFloat(static_cast<const uint16_t*>(g.in[r])[i])
                     : static_cast<const float*>(g.in[r])[i];
  };
  auto store = [&](int r, size_t i, float v) {
    if (elem == 2) {
      static_cast<uint16_t*>(g.out[r])[i] = FloatToBf16Bits(v);
    } else {
      static_cast<float*>(g.out[r])[i] = v;
    }
  };
  // Sum over ranks of element i of each input, rounded as NCCL's ring rounds (bf16: after each
  // addition).
  auto sum = [&](size_t i) {
    float acc = value(0, i);
    for (int r = 1; r < S; ++r) {
      acc += value(r, i);
      if (elem == 2) acc = Bf16BitsToFloat(FloatToBf16Bits(acc));
    }
    return acc;
  };
  switch (kind) {
    case Kind::kAllReduce: {
      std::vector<float> result(n);  // buffers may be in place
      for (size_t i = 0; i < n; ++i) result[i] = sum(i);
      for (int r = 0; r < S; ++r) {
        for (size_t i = 0; i < n; ++i) store(r, i, result[i]);
      }
      break;
    }
    case Kind::kReduceScatter: {
      std::vector<float> result(n * S);
      for (size_t i = 0; i < n * S; ++i) result[i] = sum(i);
      for (int r = 0; r < S; ++r) {
        for (size_t i = 0; i < n; ++i) store(r, i, result[r * n + i]);
      }
      break;
    }
    case Kind::kAllGather: {
      std::vector<float> result(n * S);
      for (int k = 0; k < S; ++k) {
        for (size_t i = 0; i < n; ++i) result[k * n + i] = value(k, i);
      }
      for (int r = 0; r < S; ++r) {
        for (size_t i = 0; i < n * S; ++i) store(r, i, result[i]);
      }
      break;
    }
    case Kind::kBroadcast: {
      std::vector<float> result(n);
      for (size_t i = 0; i < n; ++i) result[i] = value(root, i);
      for (int r = 0; r < S; ++r) {
        for (size_t i = 0; i < n; ++i) store(r, i, result[i]);
      }
      break;
    }
    case Kind::kBarrier:
      break;
  }
  g.arrived = 0;
  ++g.generation;
  g.cv.notify_all();
  return train::CompletedWork();
}

train::WorkHandle ThreadNccl::AllReduceSum(float* data, size_t n) {
  return Collective(Kind::kAllReduce, data, data, n, train::DeviceDType::kFloat32, 0);
}
train::WorkHandle ThreadNccl::AllReduceSum(void* data, size_t n, train::DeviceDType type) {
  return Collective(Kind::kAllReduce, data, data, n, type, 0);
}
train::WorkHandle ThreadNccl::ReduceScatterSum(const float* in, float* out, size_t n) {
  return Collective(Kind::kReduceScatter, in, out, n, train::DeviceDType::kFloat32, 0);
}
train::WorkHandle ThreadNccl::ReduceScatterSum(const void* in, void* out, size_t n,
                                               train::DeviceDType type) {
  return Collective(Kind::kReduceScatter, in, out, n, type, 0);
}
train::WorkHandle ThreadNccl::AllGather(const float* in, float* out, size_t n) {
  return Collective(Kind::kAllGather, in, out, n, train::DeviceDType::kFloat32, 0);
}
train::WorkHandle ThreadNccl::AllGather(const void* in, void* out, size_t n,
                                        train::DeviceDType type) {
  return Collective(Kind::kAllGather, in, out, n, type, 0);
}
train::WorkHandle ThreadNccl::Broadcast(float* data, size_t n, int root) {
  return Collective(Kind::kBroadcast, data, data, n, train::DeviceDType::kFloat32, root);
}
train::WorkHandle ThreadNccl::Barrier() {
  return Collective(Kind::kBarrier, nullptr, nullptr, 0, train::DeviceDType::kFloat32, 0);
}

train::WorkHandle ThreadNccl::Send(const float* data, size_t n, int dst, uint32_t) {
  if (dst < 0 || dst >= size_ || dst == rank_) Fail("send to a bad peer in " + name_);
  ThreadGroup& g = *group_;
  std::lock_guard<std::mutex> lock(g.mu);
  const char* bytes = reinterpret_cast<const char*>(data);
  g.mail[{rank_, dst}].emplace_back(bytes, bytes + n * sizeof(float));
  g.cv.notify_all();
  return train::CompletedWork();
}

train::WorkHandle ThreadNccl::Recv(float* data, size_t n, int src, uint32_t) {
  if (src < 0 || src >= size_ || src == rank_) Fail("receive from a bad peer in " + name_);
  ThreadGroup& g = *group_;
  std::unique_lock<std::mutex> lock(g.mu);
  std::deque<std::vector<char>>& box = g.mail[{src, rank_}];
  if (box.empty()) {
    WaitWithoutTurn(g, lock,
                    "rank " + std::to_string(rank_) + "'s receive from rank " +
                        std::to_string(src) + " of group " + name_,
                    [&] { return !box.empty(); });
  }
  if (box.front().size() != n * sizeof(float)) {
    Fail("group " + name_ + ": rank " + std::to_string(rank_) + " receives " +
         std::to_string(n * sizeof(float)) + " bytes, rank " + std::to_string(src) + " sent " +
         std::to_string(box.front().size()));
  }
  std::memcpy(data, box.front().data(), box.front().size());
  box.pop_front();
  return train::CompletedWork();
}

train::WorkHandle ThreadNccl::SendRecv(const float* send, size_t send_n, int dst, float* recv,
                                       size_t recv_n, int src) {
  if (send_n > 0) Send(send, send_n, dst, 0);
  if (recv_n > 0) Recv(recv, recv_n, src, 0);
  return train::CompletedWork();
}

}  // namespace loom::emu

namespace loom::train {

// Never called: the emulated ranks are handed their ThreadNccl groups. Defined because the CUDA
// backend's factory, built with LOOM_HAVE_NCCL, names it.
std::unique_ptr<NcclCommunicator> ConnectNccl(const NcclOptions&) {
  std::fprintf(stderr, "emu: ConnectNccl is not available in the emulation\n");
  std::abort();
}

}  // namespace loom::train
