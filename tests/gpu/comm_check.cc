// loom-gpu-comm-check: the communication check of issue 14 (comm_checks.h) on this machine's
// GPUs: one thread per GPU, each with a real NCCL communicator (ConnectNccl, meeting through a
// file store in a temporary directory), runs all-reduce (fp32, bf16), reduce-scatter, all-gather
// and ring send/recv over message sizes, checks every result against the known sums, and prints
// nccl-tests' table (time, algorithm and bus bandwidth) and one JSON line per result.
//
// Usage: loom-gpu-comm-check [--gpus N] [--min-bytes B] [--max-bytes B] [--iters N]
//                            [--json FILE]
// Default: every GPU, 8 KiB to 256 MiB by 4x, 10 timed iterations. Prints "no CUDA device" and
// exits 0 where there is none; exits 1 when any element is wrong or a collective fails.
#include <cuda_runtime.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/gpu/comm_checks.h"
#include "worker/train/comm/file_store.h"
#include "worker/train/comm/nccl_communicator.h"

namespace {

using loom::gpu_check::CommCheckOptions;
using loom::gpu_check::CommResult;

size_t ParseSize(const char* flag, const char* value) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(value, &end, 10);
  if (end == value || *end != '\0' || v == 0) {
    std::fprintf(stderr, "loom-gpu-comm-check: %s wants a positive integer, got '%s'\n", flag,
                 value);
    std::exit(2);
  }
  return static_cast<size_t>(v);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CommCheckOptions o;
  int gpus = -1;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: loom-gpu-comm-check [--gpus N] [--min-bytes B] [--max-bytes B] [--iters N] "
          "[--json FILE]\n");
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "loom-gpu-comm-check: %s needs a value (see --help)\n", a.c_str());
      return 2;
    }
    const char* v = argv[++i];
    if (a == "--gpus") {
      gpus = static_cast<int>(ParseSize("--gpus", v));
    } else if (a == "--min-bytes") {
      o.min_bytes = ParseSize("--min-bytes", v);
    } else if (a == "--max-bytes") {
      o.max_bytes = ParseSize("--max-bytes", v);
    } else if (a == "--iters") {
      o.iters = static_cast<int>(ParseSize("--iters", v));
    } else if (a == "--json") {
      json_path = v;
    } else {
      std::fprintf(stderr, "loom-gpu-comm-check: unknown flag %s (see --help)\n", a.c_str());
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: nothing to check\n");
    return 0;
  }
  if (gpus < 0) gpus = count;
  if (gpus > count) {
    std::fprintf(stderr, "loom-gpu-comm-check: --gpus %d, but this machine has %d\n", gpus, count);
    return 2;
  }
  const std::filesystem::path store_dir =
      std::filesystem::temp_directory_path() /
      ("loom-comm-check-" + std::to_string(::getpid()) + "-" +
       std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::printf("== loom-gpu-comm-check: %d GPU(s), %zu to %zu bytes, %d iterations\n", gpus,
              o.min_bytes, o.max_bytes, o.iters);

  std::vector<std::vector<CommResult>> results(gpus);
  std::vector<std::string> errors(gpus);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < gpus; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        if (cudaSetDevice(rank) != cudaSuccess) throw std::runtime_error("cudaSetDevice failed");
        loom::train::FileKeyValueStore store(store_dir.string());
        loom::train::NcclOptions n;
        n.rank = rank;
        n.size = gpus;
        n.device = rank;
        n.store = &store;
        n.group = "comm-check";
        n.timeout = std::chrono::seconds(120);
        std::unique_ptr<loom::train::NcclCommunicator> comm = loom::train::ConnectNccl(n);
        results[rank] = loom::gpu_check::RunCommChecks(comm.get(), o);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::error_code ignored;
  std::filesystem::remove_all(store_dir, ignored);

  int failures = 0;
  for (int rank = 0; rank < gpus; ++rank) {
    if (!errors[rank].empty()) {
      std::printf("FAIL  rank %d: %s\n", rank, errors[rank].c_str());
      ++failures;
      continue;
    }
    for (const CommResult& r : results[rank]) {
      if (r.wrong != 0) {
        std::printf("FAIL  rank %d: %s of %zu bytes: %ld wrong element(s)\n", rank, r.op.c_str(),
                    r.bytes, r.wrong);
        ++failures;
      }
    }
  }
  if (errors[0].empty()) {
    std::fputs(loom::gpu_check::FormatCommTable(results[0], gpus).c_str(), stdout);
    const std::string json = loom::gpu_check::FormatCommJson(results[0], gpus);
    if (!json_path.empty()) std::ofstream(json_path) << json;
  }
  size_t checked = 0;
  for (const auto& r : results) checked += r.size();
  if (failures == 0) {
    std::printf("PASS  %zu operation(s) on %d rank(s), every element as expected\n", checked, gpus);
  }
  std::printf("%s: %d failure(s)\n", failures == 0 ? "OK" : "FAILED", failures);
  return failures == 0 ? 0 : 1;
}
