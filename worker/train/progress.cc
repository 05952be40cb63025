#include "worker/train/progress.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "worker/train/config/json.h"

namespace loom::train {

namespace {

std::string NumberArray(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%s%.9g", i ? "," : "", v[i]);
    out += buf;
  }
  return out + "]";
}

}  // namespace

std::string BlockSecondsJson(const BlockCosts& c) {
  JsonObject o;
  o.Add("first_block", c.first_block)
      .AddRaw("forward", NumberArray(c.forward))
      .AddRaw("backward", NumberArray(c.backward));
  if (c.has_embedding) {
    o.AddRaw("embedding", NumberArray({c.embedding_forward, c.embedding_backward}));
  }
  if (c.has_head) o.AddRaw("head", NumberArray({c.head_forward, c.head_backward}));
  return o.str();
}

Progress::Progress(int rank, int64_t total_steps, int progress_fd, bool human)
    : rank_(rank), total_steps_(total_steps), fd_(progress_fd), human_(human) {}

std::string Progress::StepJson(const StepResult& r) const {
  JsonObject phases;
  for (int p = 0; p < static_cast<int>(Phase::kCount); ++p) {
    phases.Add(PhaseName(static_cast<Phase>(p)), r.times.seconds[p]);
  }
  JsonObject comm_bytes;  // bytes moved per collective kind
  comm_bytes.Add("all_reduce", static_cast<uint64_t>(r.allreduce_bytes))
      .Add("tp_all_reduce", static_cast<uint64_t>(r.comm.tp_all_reduce))
      .Add("pp_send_recv", static_cast<uint64_t>(r.comm.pp_send_recv))
      .Add("emb_all_reduce", static_cast<uint64_t>(r.comm.emb_all_reduce))
      .Add("all_gather", static_cast<uint64_t>(r.comm.all_gather))
      .Add("world_all_reduce", static_cast<uint64_t>(r.comm.world_all_reduce));
  JsonObject o;
  o.Add("event", "step")
      .Add("rank", rank_)
      .Add("step", r.step)
      .Add("total_steps", total_steps_)
      .Add("loss", static_cast<double>(r.loss))
      .Add("lr", r.lr)
      .Add("grad_norm", r.grad_norm)
      .Add("tokens_per_second", r.times.tokens_per_second)
      .Add("step_seconds", r.times.step_seconds)
      .AddRaw("phases", phases.str())
      .AddRaw("comm_bytes", comm_bytes.str())
      .Add("dp_comm_seconds", r.dp_comm_seconds)
      .Add("overlap_ratio", r.overlap_ratio)
      .Add("bubble_ratio", r.bubble_ratio)
      .Add("idle_ratio", r.idle_ratio)
      .Add("memory_bytes", static_cast<uint64_t>(r.memory_bytes))
      .Add("peak_memory_bytes", static_cast<uint64_t>(r.peak_memory_bytes))
      .Add("rss_bytes", static_cast<uint64_t>(r.rss_bytes))
      .Add("reserved_memory_bytes", static_cast<uint64_t>(r.reserved_memory_bytes))
      .Add("memory_fragmentation", r.memory_fragmentation)
      .Add("device_allocations", r.device_allocations)
      .Add("device", r.device);
  if (r.has_block_costs) o.AddRaw("block_seconds", BlockSecondsJson(r.block_costs));
  return o.str();
}

void Progress::Step(const StepResult& r) {
  Emit(StepJson(r));
  if (human_) {
    // A GPU rank also shows what its caching allocator holds and how scattered the free part is;
    // on the CPU both would repeat "mem".
    char gpu_memory[96] = "";
    if (r.device.rfind("cuda", 0) == 0) {
      std::snprintf(gpu_memory, sizeof(gpu_memory), " (reserved %.1f MiB, frag %.2f)",
                    r.reserved_memory_bytes / 1048576.0, r.memory_fragmentation);
    }
    std::fprintf(stderr,
                 "step %lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.1f ms | "
                 "mem %.1f MiB%s\n",
                 static_cast<long long>(r.step), static_cast<long long>(total_steps_), r.loss, r.lr,
                 r.grad_norm, r.times.tokens_per_second, r.times.step_seconds * 1e3,
                 r.memory_bytes / 1048576.0, gpu_memory);
  }
}

void Progress::Eval(int64_t step, float val_loss) {
  JsonObject o;
  o.Add("event", "eval")
      .Add("rank", rank_)
      .Add("step", step)
      .Add("val_loss", static_cast<double>(val_loss));
  Emit(o.str());
  if (human_)
    std::fprintf(stderr, "step %lld: val loss %.4f\n", static_cast<long long>(step), val_loss);
}

void Progress::Checkpoint(int64_t step, const std::string& dir, double seconds) {
  JsonObject o;
  o.Add("event", "checkpoint").Add("rank", rank_).Add("step", step).Add("dir", dir);
  o.Add("seconds", seconds);
  Emit(o.str());
}

void Progress::Emit(const std::string& json) {
  std::string line = json + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
  if (fd_ < 0) return;
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::fprintf(stderr, "loom-train: progress fd %d: %s; no more progress lines there\n", fd_,
                   std::strerror(errno));
      fd_ = -1;
      return;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace loom::train
