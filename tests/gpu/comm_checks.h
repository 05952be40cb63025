// The communication check of issue 14, in the style of nccl-tests: all-reduce (fp32 and bf16),
// reduce-scatter, all-gather and a ring send/recv over a range of message sizes, on one rank of
// a group of NcclCommunicators (one per GPU; the real NCCL in loom-gpu-comm-check, the CPU
// emulation's stand-in in tests/gpu/emu). Every operation is a correctness test: each rank's
// input is a known pattern whose sums are small integers (exact in fp32 and in bf16), and the
// output is compared element for element. Timing: `iters` back-to-back operations after
// `warmup`, from the first issue to the last completion on the host; the algorithm bandwidth is
// the operation's size over that time and the bus bandwidth applies nccl-tests' factor (all-reduce
// 2(n-1)/n, reduce-scatter and all-gather (n-1)/n, send/recv 1), the figure to compare with the
// link's (the planner's intra_node_gb_per_s).
//
// Threading: RunCommChecks is called by every rank of the group at once, each from its own thread
// (or process) with its communicator; the ranks issue the same operations in the same order.
#ifndef LOOM_TESTS_GPU_COMM_CHECKS_H_
#define LOOM_TESTS_GPU_COMM_CHECKS_H_

#include <cstddef>
#include <string>
#include <vector>

#include "worker/train/comm/nccl_communicator.h"

namespace loom::gpu_check {

struct CommCheckOptions {
  size_t min_bytes = size_t{8} << 10;    // the smallest message (bytes of fp32 data per rank)
  size_t max_bytes = size_t{256} << 20;  // the largest
  int factor = 4;                        // each size is the previous one times this
  int warmup = 3;
  int iters = 10;
};

// One operation at one size on one rank.
struct CommResult {
  std::string op;       // "all_reduce_f32", "all_reduce_bf16", "reduce_scatter", "all_gather",
                        // "send_recv"
  size_t bytes = 0;     // the operation's size: the all-reduced buffer, the reduce-scatter's
                        // input, the all-gather's output, one send/recv message
  size_t elements = 0;  // elements per rank's buffer in that size
  double seconds = 0;   // mean time of one operation
  double algbw = 0;     // bytes / seconds, in GB/s (1e9 bytes)
  double busbw = 0;     // algbw times the operation's bus factor
  long wrong = 0;       // elements that differ from the known result (after every iteration)
};

// The bus-bandwidth factor of `op` for a group of `ranks` (nccl-tests' definition).
double BusFactor(const std::string& op, int ranks);

// Runs every operation over the sizes on `comm` (device buffers on comm->device(), which must
// be current on this thread). Send/recv needs a group of more than one rank (skipped in a group
// of one). Returns this rank's results; throws CommError as the communicator does.
std::vector<CommResult> RunCommChecks(train::NcclCommunicator* comm, const CommCheckOptions& o);

// The table of rank 0's results (one line per operation and size, nccl-tests' columns) and a
// JSON line per result ({"op":..,"bytes":..,"algbw_gb_s":..,"busbw_gb_s":..,"wrong":..}).
std::string FormatCommTable(const std::vector<CommResult>& results, int ranks);
std::string FormatCommJson(const std::vector<CommResult>& results, int ranks);

}  // namespace loom::gpu_check

#endif  // LOOM_TESTS_GPU_COMM_CHECKS_H_
