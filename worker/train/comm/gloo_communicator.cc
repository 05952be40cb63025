// Collectives run on a CommThread (in issue order); point-to-point operations are posted at
// once from the caller's thread (Gloo's unbound buffers allow that) and a second CommThread
// waits for their completion in posting order, so a Recv never waits behind a collective.
#include "worker/train/comm/gloo_communicator.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/types.h"
#include "worker/train/comm/collective_log.h"
#include "worker/train/comm/comm_thread.h"
#include "worker/train/error.h"

namespace loom::train {
namespace {

// Slot prefix of point-to-point messages: above Gloo's own collective prefixes (0x01..0x08).
constexpr uint8_t kP2pSlotPrefix = 0x40;
// Slot prefix of the ring reduce-scatter's messages (slot = prefix, collective tag + step).
constexpr uint8_t kRingSlotPrefix = 0x41;

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout)
      : context_(std::move(context)), timeout_(timeout) {}

  // The threads go first: they may be using the context.
  ~GlooCommunicator() override {
    p2p_.reset();
    collectives_.reset();
  }

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  WorkHandle AllReduceSum(float* data, size_t n) override {
    collective_log::Note(collective_log::kAllReduce);
    const uint32_t tag = next_tag_++;
    return collectives_->Enqueue("gloo allreduce", [this, data, n, tag] {
      if (n == 0) return;
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, n);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  // A ring reduce-scatter over the full mesh's pairs: size - 1 steps; in step s rank r sends
  // its running sum of chunk (r - s - 1) mod size to rank r + 1 and receives chunk
  // (r - s - 2) mod size from rank r - 1, to which it adds its own. Each rank sends and receives
  // (size - 1) * n floats, half of what an all-reduce of the whole input would move. Chunk c is
  // summed in one fixed order (starting at rank c + 1, ending at rank c), so the result is
  // independent of timing. Gloo's own reduce-scatter (halving-doubling) is the older
  // pointer-vector Algorithm API with context-wide slots, which does not fit the tagged,
  // timeout-bounded options API used by the other collectives here.
  WorkHandle ReduceScatterSum(const float* in, float* out, size_t n) override {
    collective_log::Note(collective_log::kReduceScatter);
    const uint32_t tag = next_tag_++;
    return collectives_->Enqueue("gloo reduce_scatter", [this, in, out, n, tag] {
      if (n == 0) return;
      const int p = size(), r = rank();
      // A slot carries at most 255 steps past its base (gloo::Slot::operator+).
      LOOM_CHECK(p <= 256, "the ring reduce-scatter supports groups of at most 256 ranks");
      if (p == 1) {
        std::copy_n(in, n, out);
        return;
      }
      const int next = (r + 1) % p, prev = (r + p - 1) % p;
      auto chunk = [&](int c) { return in + static_cast<size_t>((c % p + p) % p) * n; };
      // send: the running sum leaving in this step; recv: the peer's arriving one.
      std::vector<float> send(chunk(r - 1), chunk(r - 1) + n);
      std::vector<float> recv(n);
      std::shared_ptr<gloo::transport::UnboundBuffer> send_buf =
          context_->createUnboundBuffer(send.data(), n * sizeof(float));
      std::shared_ptr<gloo::transport::UnboundBuffer> recv_buf =
          context_->createUnboundBuffer(recv.data(), n * sizeof(float));
      collectives_->SetInterrupt([send_buf, recv_buf] {
        send_buf->abortWaitSend();
        recv_buf->abortWaitRecv();
      });
      for (int s = 0; s < p - 1; ++s) {
        // One slot per step: a late step can never match an earlier one's message.
        const uint64_t slot = gloo::Slot::build(kRingSlotPrefix, tag) + static_cast<uint8_t>(s);
        recv_buf->recv(prev, slot);
        send_buf->send(next, slot);
        if (!recv_buf->waitRecv(timeout_) || !send_buf->waitSend(timeout_)) {
          throw CommError("interrupted (reduce-scatter step " + std::to_string(s) + ")");
        }
        const float* own = chunk(r - s - 2);
        float* dst = s == p - 2 ? out : send.data();
        for (size_t i = 0; i < n; ++i) dst[i] = recv[i] + own[i];
      }
    });
  }

  WorkHandle AllGather(const float* in, float* out, size_t n) override {
    collective_log::Note(collective_log::kAllGather);
    const uint32_t tag = next_tag_++;
    return collectives_->Enqueue("gloo allgather", [this, in, out, n, tag] {
      if (n == 0) return;
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<float*>(in), n);  // read only
      opts.setOutput(out, n * size());
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  WorkHandle Broadcast(float* data, size_t n, int root) override {
    collective_log::Note(collective_log::kBroadcast);
    LOOM_CHECK(root >= 0 && root < size(), "broadcast root out of range");
    const uint32_t tag = next_tag_++;
    return collectives_->Enqueue("gloo broadcast", [this, data, n, root, tag] {
      if (n == 0) return;
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(data, n);
      opts.setRoot(root);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  WorkHandle Barrier() override {
    collective_log::Note(collective_log::kBarrier);
    const uint32_t tag = next_tag_++;
    return collectives_->Enqueue("gloo barrier", [this, tag] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

  WorkHandle Send(const float* data, size_t n, int dst, uint32_t tag) override {
    collective_log::Note(collective_log::kSend);
    LOOM_CHECK(dst >= 0 && dst < size() && dst != rank(), "send destination out of range");
    return PostP2p("gloo send", const_cast<float*>(data), n, dst, tag, /*send=*/true);
  }

  WorkHandle Recv(float* data, size_t n, int src, uint32_t tag) override {
    collective_log::Note(collective_log::kRecv);
    LOOM_CHECK(src >= 0 && src < size() && src != rank(), "recv source out of range");
    return PostP2p("gloo recv", data, n, src, tag, /*send=*/false);
  }

  void Abort(const std::string& why) override {
    collectives_->Abort(why);
    p2p_->Abort(why);
  }

 private:
  WorkHandle PostP2p(const char* what, float* data, size_t n, int peer, uint32_t tag, bool send) {
    if (p2p_->aborted()) return p2p_->Enqueue(what, [] {});  // comes back failed
    // Posted here, on the caller's thread, so that opposite sends and recvs of two ranks can
    // never wait on each other; only the waiting happens on the p2p thread.
    std::shared_ptr<gloo::transport::UnboundBuffer> buf;
    try {
      buf = context_->createUnboundBuffer(data, n * sizeof(float));
      const uint64_t slot = gloo::Slot::build(kP2pSlotPrefix, tag);
      if (send) {
        buf->send(peer, slot);
      } else {
        buf->recv(peer, slot);
      }
    } catch (const std::exception& e) {
      // Posting throws when the pair already failed (the peer died earlier): the same failure
      // as one that comes while waiting, so it reaches the caller the same way, through Wait(),
      // and poisons the later point-to-point operations like any failure.
      const std::string error = std::string(what) + ": " + e.what();
      p2p_->Abort(error);
      auto failed = std::make_shared<Work>();
      failed->Fail(error);
      return failed;
    }
    auto timeout = timeout_;
    CommThread* thread = p2p_.get();
    return p2p_->Enqueue(what, [buf, send, timeout, thread, peer, tag] {
      thread->SetInterrupt([buf, send] {
        if (send) {
          buf->abortWaitSend();
        } else {
          buf->abortWaitRecv();
        }
      });
      const bool completed = send ? buf->waitSend(timeout) : buf->waitRecv(timeout);
      if (!completed) {
        throw CommError("interrupted (peer " + std::to_string(peer) + ", tag " +
                        std::to_string(tag) + ")");
      }
    });
  }

  std::shared_ptr<gloo::Context> context_;
  std::chrono::milliseconds timeout_;
  uint32_t next_tag_ = 0;  // collectives: issued from one thread (the contract)
  // A failed operation poisons its thread: later ones fail at once with its message.
  std::unique_ptr<CommThread> collectives_ = std::make_unique<CommThread>(true);
  std::unique_ptr<CommThread> p2p_ = std::make_unique<CommThread>(true);
};

// Gloo's store interface over a KeyValueStore (loomd's RendezvousService). Gloo calls it only
// from the thread inside connectFullMesh. get() waits for its key, as Gloo's FileStore does, so
// a get that races ahead of the peer's set still succeeds. Errors of the store (CommError)
// pass through Gloo to ConnectGloo, which names the rank and the store.
class KeyValueGlooStore : public gloo::rendezvous::Store {
 public:
  KeyValueGlooStore(KeyValueStore* store, std::chrono::milliseconds timeout)
      : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->Set(key, std::string(data.begin(), data.end()));
  }

  std::vector<char> get(const std::string& key) override {
    const std::string value = store_->Wait({key}, timeout_).at(0);
    return std::vector<char>(value.begin(), value.end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_->Wait(keys, timeout);
  }

 private:
  KeyValueStore* const store_;
  const std::chrono::milliseconds timeout_;
};

// Gloo's FileStore, waiting in 10 ms steps: its own wait sleeps a whole second between looks,
// which rounds every timeout up to seconds and makes probing for missing ranks slow.
class FileStore : public gloo::rendezvous::FileStore {
 public:
  FileStore(const std::string& path, std::chrono::milliseconds timeout)
      : gloo::rendezvous::FileStore(path), timeout_(timeout) {}

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!check(keys)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        std::string list;
        for (const std::string& k : keys) list += (list.empty() ? "" : ", ") + k;
        throw CommError("timed out after " + std::to_string(timeout.count()) + " ms waiting for " +
                        list + " in " + basePath_);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

 private:
  const std::chrono::milliseconds timeout_;
};

std::string ArrivalKey(int rank) { return "arrived/" + std::to_string(rank); }

// "5 s", "0.3 s": a timeout as people write it.
std::string Seconds(std::chrono::milliseconds t) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", static_cast<double>(t.count()) / 1000.0);
  return text;
}

// Every rank announces itself under <group>/arrived/<rank>, then waits for all the others. This
// step exists for its failure: Gloo's connectFullMesh only reports a key it waited for in vain,
// while a gang that did not assemble should say which ranks never came (the ones whose node or
// process is at fault). Once everyone has arrived, connectFullMesh finds every address at once.
void AwaitArrivals(gloo::rendezvous::Store& store, const GlooOptions& o, const std::string& where) {
  const std::string head =
      "rank " + std::to_string(o.rank) + ": rendezvous of " + std::to_string(o.size) + " ranks ";
  std::vector<std::string> keys;
  for (int r = 0; r < o.size; ++r) keys.push_back(ArrivalKey(r));
  std::string error;
  try {
    store.set(ArrivalKey(o.rank), std::vector<char>{'1'});
  } catch (const std::exception& e) {
    throw CommError(head + "in " + where + " failed: " + e.what());
  }
  try {
    store.wait(keys, o.timeout);
    return;
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Who is missing: each key on its own, with a wait that is only long enough to read it.
  std::vector<int> missing;
  for (int r = 0; r < o.size; ++r) {
    try {
      store.wait({ArrivalKey(r)}, std::chrono::milliseconds(1));
    } catch (const std::exception&) {
      missing.push_back(r);
    }
  }
  if (std::find(missing.begin(), missing.end(), o.rank) != missing.end()) {
    // Not even our own key reads back: the store itself fails, not the peers.
    throw CommError(head + "in " + where + " failed: " + error);
  }
  if (missing.empty()) return;  // the last ones arrived while the wait was giving up
  std::string list;
  for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
  throw CommError(head + "timed out after " + Seconds(o.timeout) + " in " + where + ": " +
                  (missing.size() == 1 ? "rank " : "ranks ") + list + " never arrived");
}

}  // namespace

std::unique_ptr<Communicator> ConnectGloo(const GlooOptions& o) {
  LOOM_CHECK(o.size >= 1 && o.rank >= 0 && o.rank < o.size, "rank out of [0, size)");
  LOOM_CHECK(!o.group.empty(), "a Gloo group needs a name");
  const std::string where = o.store ? o.store->Describe() : "the file store in " + o.store_dir;
  std::unique_ptr<gloo::rendezvous::Store> base;
  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = o.host;
    device = gloo::transport::tcp::CreateDevice(attr);
    if (o.store != nullptr) {
      base = std::make_unique<KeyValueGlooStore>(o.store, o.timeout);
    } else {
      base = std::make_unique<FileStore>(o.store_dir, o.timeout);
    }
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(o.rank) + " of " + std::to_string(o.size) +
                    ": cannot start the rendezvous through " + where + ": " + e.what());
  }
  gloo::rendezvous::PrefixStore store(o.group, *base);
  AwaitArrivals(store, o, where);
  try {
    auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
    context->setTimeout(o.timeout);
    context->connectFullMesh(store, device);
    return std::make_unique<GlooCommunicator>(context, o.timeout);
  } catch (const std::exception& e) {
    throw CommError("rendezvous of rank " + std::to_string(o.rank) + " of " +
                    std::to_string(o.size) + " through " + where + " failed: " + e.what());
  }
}

}  // namespace loom::train
