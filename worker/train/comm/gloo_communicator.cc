// Collectives run on a CommThread (in issue order); point-to-point operations are posted at
// once from the caller's thread (Gloo's unbound buffers allow that) and a second CommThread
// waits for their completion in posting order, so a Recv never waits behind a collective.
#include "worker/train/comm/gloo_communicator.h"

#include <algorithm>
#include <cstring>
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
#include "worker/train/comm/comm_thread.h"
#include "worker/train/error.h"

namespace loom::train {
namespace {

// Slot prefix of point-to-point messages: above Gloo's own collective prefixes (0x01..0x08).
constexpr uint8_t kP2pSlotPrefix = 0x40;

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
    const uint32_t tag = next_tag_++;
    return collectives_->Enqueue("gloo allreduce", [this, data, n, tag] {
      if (n == 0) return;
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, n);
      opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(
          &gloo::sum<float>));
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  // A first implementation: all-reduce a copy, keep this rank's chunk (twice the traffic of a
  // direct reduce-scatter; ZeRO-1, its user, is a later step).
  WorkHandle ReduceScatterSum(const float* in, float* out, size_t n) override {
    const uint32_t tag = next_tag_++;
    return collectives_->Enqueue("gloo reduce_scatter", [this, in, out, n, tag] {
      if (n == 0) return;
      std::vector<float> all(in, in + n * size());  // (size, n)
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(all.data(), all.size());
      opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(
          &gloo::sum<float>));
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
      std::copy_n(all.data() + n * rank(), n, out);
    });
  }

  WorkHandle AllGather(const float* in, float* out, size_t n) override {
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
    const uint32_t tag = next_tag_++;
    return collectives_->Enqueue("gloo barrier", [this, tag] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

  WorkHandle Send(const float* data, size_t n, int dst, uint32_t tag) override {
    LOOM_CHECK(dst >= 0 && dst < size() && dst != rank(), "send destination out of range");
    return PostP2p("gloo send", const_cast<float*>(data), n, dst, tag, /*send=*/true);
  }

  WorkHandle Recv(float* data, size_t n, int src, uint32_t tag) override {
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
    std::shared_ptr<gloo::transport::UnboundBuffer> buf =
        context_->createUnboundBuffer(data, n * sizeof(float));
    const uint64_t slot = gloo::Slot::build(kP2pSlotPrefix, tag);
    if (send) {
      buf->send(peer, slot);
    } else {
      buf->recv(peer, slot);
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
  std::unique_ptr<CommThread> collectives_ = std::make_unique<CommThread>();
  std::unique_ptr<CommThread> p2p_ = std::make_unique<CommThread>();
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

}  // namespace

std::unique_ptr<Communicator> ConnectGloo(const GlooOptions& o) {
  LOOM_CHECK(o.size >= 1 && o.rank >= 0 && o.rank < o.size, "rank out of [0, size)");
  const std::string where = o.store ? o.store->Describe() : o.store_dir;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = o.host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    std::unique_ptr<gloo::rendezvous::Store> base;
    if (o.store != nullptr) {
      base = std::make_unique<KeyValueGlooStore>(o.store, o.timeout);
    } else {
      base = std::make_unique<gloo::rendezvous::FileStore>(o.store_dir);
    }
    gloo::rendezvous::PrefixStore store("world", *base);
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
