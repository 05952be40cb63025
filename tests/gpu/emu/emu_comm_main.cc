// The communication check (tests/gpu/comm_checks.h, loom-gpu-comm-check's core) on emulated GPU
// ranks: the same code that runs over NCCL on the device machine, here over ThreadNccl (the
// test-role stand-in, thread_nccl.h) for groups of 1, 2 and 4 ranks, at small sizes. What it
// checks: the known-result patterns and their verification (every element right, exit 0), the
// buffers and copies of each operation, the send/recv ring's order; the bandwidths printed are
// the emulation's, not a device's.
//
// Usage: emu_comm_check. Prints the tables and "OK"/"FAILED"; exits non-zero on any failure.
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "tests/gpu/comm_checks.h"
#include "tests/gpu/emu/thread_nccl.h"

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  loom::gpu_check::CommCheckOptions o;
  o.min_bytes = 1 << 10;  // 1 KiB, 8 KiB, 64 KiB
  o.max_bytes = 64 << 10;
  o.factor = 8;
  o.warmup = 1;
  o.iters = 2;
  int failures = 0;
  for (int ranks : {1, 2, 4}) {
    std::vector<std::vector<loom::gpu_check::CommResult>> results(ranks);
    std::vector<std::string> errors(ranks);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < ranks; ++rank) {
      threads.emplace_back([&, rank] {
        loom::emu::TakeTurn();
        try {
          loom::emu::ThreadNccl comm("comm-check-" + std::to_string(ranks), rank, ranks);
          results[rank] = loom::gpu_check::RunCommChecks(&comm, o);
        } catch (const std::exception& e) {
          errors[rank] = e.what();
        }
        loom::emu::GiveTurn();
      });
    }
    for (std::thread& t : threads) t.join();
    std::printf("== %d emulated rank(s)\n", ranks);
    // Every operation at every size, on every rank: 4 per size alone, 5 with send/recv.
    const size_t expected = 3 * (ranks > 1 ? 5 : 4);
    for (int rank = 0; rank < ranks; ++rank) {
      bool ok = errors[rank].empty() && results[rank].size() == expected;
      long wrong = 0;
      for (const auto& r : results[rank]) wrong += r.wrong;
      ok = ok && wrong == 0;
      std::printf("%s  rank %d of %d: %zu operation(s), %ld wrong element(s)%s%s\n",
                  ok ? "PASS" : "FAIL", rank, ranks, results[rank].size(), wrong,
                  errors[rank].empty() ? "" : ": ", errors[rank].c_str());
      failures += !ok;
    }
    if (errors[0].empty()) {
      std::fputs(loom::gpu_check::FormatCommTable(results[0], ranks).c_str(), stdout);
    }
  }
  std::printf("%s: %d failure(s)\n", failures == 0 ? "OK" : "FAILED", failures);
  return failures == 0 ? 0 : 1;
}
