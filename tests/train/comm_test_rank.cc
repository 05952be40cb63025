// comm_test_rank: a TEST ROLE, not part of Loom. It plays one rank of a Gloo (or NCCL) world so
// the failure tests (comm_failure_test.cc, nccl_comm_test.cc) can kill real processes
// mid-collective.
//
//   comm_test_rank --store DIR --rank R --size N [--iterations K] [--elements E]
//                  [--timeout-ms T] [--die-at I] [--hang-at I] [--mode allreduce|ring]
//                  [--backend gloo|nccl]
//
// Connects a world through the file store in DIR (NCCL: rank r on CUDA device r, host values
// copied to and from device buffers around each operation), then runs K all-reduces of E floats
// whose sums are known (rank r contributes (r + 1) * (i + 1) + j at iteration i, element j) and
// checks each result, printing "iteration I ok" on stdout after each. With --mode ring each
// iteration is instead a point-to-point ring exchange: rank r sends its values to r + 1 and
// receives those of r - 1 (the path of pipeline parallelism). With --die-at I the rank SIGKILLs
// itself just before issuing iteration I (the others are then inside that collective); with
// --hang-at I it stops there and sleeps without dying (the others must time out).
//
// Exit codes: 0 all iterations correct; 1 CommError (the expected outcome for survivors; the
// message is on stderr); 2 bad arguments or built without the backend; 3 a wrong sum.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "worker/train/comm/communicator.h"
#include "worker/train/comm/file_store.h"
#ifdef LOOM_HAVE_GLOO
#include "worker/train/comm/gloo_communicator.h"
#endif
#ifdef LOOM_HAVE_NCCL
#include "worker/train/comm/nccl_communicator.h"
#endif

namespace loom::train {
namespace {

struct Args {
  std::string store;
  int rank = -1;
  int size = 0;
  int iterations = 10;
  size_t elements = 1024;
  int timeout_ms = 5000;
  int die_at = -1;
  int hang_at = -1;
  bool ring = false;  // --mode ring: Send/Recv instead of all-reduce
  bool nccl = false;  // --backend nccl
};

bool Parse(int argc, char** argv, Args* a) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* v = argv[i + 1];
    if (flag == "--store") {
      a->store = v;
    } else if (flag == "--rank") {
      a->rank = std::atoi(v);
    } else if (flag == "--size") {
      a->size = std::atoi(v);
    } else if (flag == "--iterations") {
      a->iterations = std::atoi(v);
    } else if (flag == "--elements") {
      a->elements = static_cast<size_t>(std::atol(v));
    } else if (flag == "--timeout-ms") {
      a->timeout_ms = std::atoi(v);
    } else if (flag == "--die-at") {
      a->die_at = std::atoi(v);
    } else if (flag == "--hang-at") {
      a->hang_at = std::atoi(v);
    } else if (flag == "--backend") {
      if (std::string(v) != "nccl" && std::string(v) != "gloo") return false;
      a->nccl = std::string(v) == "nccl";
    } else if (flag == "--mode") {
      if (std::string(v) != "ring" && std::string(v) != "allreduce") return false;
      a->ring = std::string(v) == "ring";
    } else {
      return false;
    }
  }
  return argc % 2 == 1 && !a->store.empty() && a->size >= 1 && a->rank >= 0 && a->rank < a->size &&
         a->iterations >= 0 && a->timeout_ms > 0;
}

// One iteration's communication, on host values, whatever the backend.
class Exchange {
 public:
  virtual ~Exchange() = default;
  // x := the elementwise sum over ranks.
  virtual void AllReduce(std::vector<float>& x) = 0;
  // Sends x to `right`, then x := what `left` sent.
  virtual void Ring(std::vector<float>& x, int right, int left, uint32_t tag) = 0;
};

#ifdef LOOM_HAVE_GLOO
class GlooExchange : public Exchange {
 public:
  explicit GlooExchange(std::unique_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  void AllReduce(std::vector<float>& x) override {
    comm_->AllReduceSum(x.data(), x.size())->Wait();
  }
  void Ring(std::vector<float>& x, int right, int left, uint32_t tag) override {
    std::vector<float> y(x.size(), -1.0f);
    WorkHandle sent = comm_->Send(x.data(), x.size(), right, tag);
    WorkHandle got = comm_->Recv(y.data(), y.size(), left, tag);
    got->Wait();
    sent->Wait();
    x.swap(y);
  }

 private:
  std::unique_ptr<Communicator> comm_;
};
#endif

#ifdef LOOM_HAVE_NCCL
void Cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CommError(std::string(what) + ": " + cudaGetErrorString(e));
}

class NcclExchange : public Exchange {
 public:
  NcclExchange(std::unique_ptr<NcclCommunicator> comm, size_t n) : comm_(std::move(comm)) {
    Cuda(cudaMalloc(reinterpret_cast<void**>(&a_), n * sizeof(float)), "cudaMalloc");
    Cuda(cudaMalloc(reinterpret_cast<void**>(&b_), n * sizeof(float)), "cudaMalloc");
  }
  ~NcclExchange() override {
    comm_.reset();
    cudaFree(a_);
    cudaFree(b_);
  }
  void AllReduce(std::vector<float>& x) override {
    const size_t bytes = x.size() * sizeof(float);
    Cuda(cudaMemcpy(a_, x.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    comm_->AllReduceSum(a_, x.size())->Wait();
    Cuda(cudaMemcpy(x.data(), a_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
  void Ring(std::vector<float>& x, int right, int left, uint32_t tag) override {
    const size_t bytes = x.size() * sizeof(float);
    Cuda(cudaMemcpy(a_, x.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    comm_->SendRecv(a_, x.size(), right, b_, x.size(), left)->Wait();
    Cuda(cudaMemcpy(x.data(), b_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }

 private:
  std::unique_ptr<NcclCommunicator> comm_;
  float* a_ = nullptr;
  float* b_ = nullptr;
};
#endif

// The backend's world, or nullptr where this build lacks it.
std::unique_ptr<Exchange> Connect(const Args& a) {
  if (a.nccl) {
#ifdef LOOM_HAVE_NCCL
    Cuda(cudaSetDevice(a.rank), "cudaSetDevice");
    FileKeyValueStore store(a.store);
    NcclOptions o;
    o.rank = a.rank;
    o.size = a.size;
    o.device = a.rank;
    o.store = &store;
    o.timeout = std::chrono::milliseconds(a.timeout_ms);
    return std::make_unique<NcclExchange>(ConnectNccl(o), a.elements);
#else
    return nullptr;
#endif
  }
#ifdef LOOM_HAVE_GLOO
  GlooOptions o;
  o.rank = a.rank;
  o.size = a.size;
  o.store_dir = a.store;
  o.timeout = std::chrono::milliseconds(a.timeout_ms);
  return std::make_unique<GlooExchange>(ConnectGloo(o));
#else
  return nullptr;
#endif
}

int Main(int argc, char** argv) {
  // As loom-train does (worker/train/main.cc): a write to the socket of a dead peer must surface
  // as EPIPE, i.e. a CommError and exit 1, not kill this rank with SIGPIPE. Set here, not
  // inherited: the tests start ranks with default dispositions (tests/support/child_signals.h).
  ::signal(SIGPIPE, SIG_IGN);
  Args a;
  if (!Parse(argc, argv, &a)) {
    std::fprintf(stderr,
                 "usage: comm_test_rank --store DIR --rank R --size N [--iterations K] "
                 "[--elements E] [--timeout-ms T] [--die-at I] [--hang-at I] "
                 "[--mode allreduce|ring] [--backend gloo|nccl]\n");
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(a.store, ec);  // every rank may be first
  try {
    std::unique_ptr<Exchange> exchange = Connect(a);
    if (!exchange) {
      std::fprintf(stderr, "comm_test_rank: built without the %s backend\n",
                   a.nccl ? "nccl" : "gloo");
      return 2;
    }
    std::vector<float> x(a.elements);
    for (int it = 0; it < a.iterations; ++it) {
      if (it == a.die_at) ::kill(::getpid(), SIGKILL);
      if (it == a.hang_at) {
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      for (size_t j = 0; j < x.size(); ++j) x[j] = static_cast<float>((a.rank + 1) * (it + 1) + j);
      double ranks = a.size * (a.size + 1) / 2.0;  // sum over r of r + 1
      double per_element = a.size;                 // sum over r of 1
      if (a.ring) {
        const int right = (a.rank + 1) % a.size, left = (a.rank + a.size - 1) % a.size;
        exchange->Ring(x, right, left, static_cast<uint32_t>(it));
        ranks = left + 1;
        per_element = 1;
      } else {
        exchange->AllReduce(x);
      }
      // Exact in fp32 for the sizes used.
      for (size_t j = 0; j < x.size(); ++j) {
        const double want = ranks * (it + 1) + per_element * j;
        if (x[j] != static_cast<float>(want)) {
          std::fprintf(stderr, "rank %d iteration %d element %zu: %g, want %g\n", a.rank, it, j,
                       x[j], want);
          return 3;
        }
      }
      std::printf("iteration %d ok\n", it);
      std::fflush(stdout);
    }
    return 0;
  } catch (const CommError& e) {
    std::fprintf(stderr, "comm_test_rank %d: communication: %s\n", a.rank, e.what());
    return 1;
  }
}

}  // namespace
}  // namespace loom::train

int main(int argc, char** argv) { return loom::train::Main(argc, argv); }
