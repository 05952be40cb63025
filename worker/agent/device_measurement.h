// The worker measures its CPU devices when it starts (issue 12, part 7): it runs the rank
// program as `RANK_PROGRAM --measure-device` (worker/train/measure/device_peaks.h) three times
// (MeasureCpuDevicesMedian), reads the one JSON line each prints, and registers its CPU devices with those figures (Device.peaks), which
// loomd's planner uses instead of its catalog's guesses.
//
// Measurements of several workers on one host are serialized (an advisory lock on a file in the
// system's temporary directory): two measuring at once would each see half the cores. A
// measurement that fails, times out or prints nonsense is logged and the devices register
// without figures (the planner then uses its catalog); it never stops the worker.
// GPUs are not measured yet.
#ifndef LOOM_WORKER_AGENT_DEVICE_MEASUREMENT_H_
#define LOOM_WORKER_AGENT_DEVICE_MEASUREMENT_H_

#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "loom/v1/node.pb.h"
#include "worker/agent/rank_user.h"

namespace loom::worker {

// The figures in `line` (the measurement's output, one JSON object with "event":"device_peaks").
// INVALID_ARGUMENT, naming what is wrong, for anything else: not JSON, another event, no GEMM
// sample, more than 16 samples of a kind. Values are range-checked by loomd, not here.
absl::StatusOr<v1::DevicePeaks> ParseDevicePeaks(std::string_view line);

// Runs `program --measure-device` with exactly `env` as its environment, as the ranks' user
// (`identity`, as the launcher switches to it), its stdout read (at most 64 KiB), stdin and
// stderr to /dev/null; killed after `timeout`. The figures of its last line.
absl::StatusOr<v1::DevicePeaks> MeasureCpuDevices(const std::string& program,
                                                  const std::map<std::string, std::string>& env,
                                                  const RankIdentity& identity,
                                                  absl::Duration timeout);

// MeasureCpuDevices `runs` times (separate processes): each figure is the median over the runs
// that succeeded. One process's small GEMMs can run an order of magnitude slower than the next
// one's (OpenBLAS's threads), so one run is not enough. Fails only when every run failed.
absl::StatusOr<v1::DevicePeaks> MeasureCpuDevicesMedian(
    const std::string& program, const std::map<std::string, std::string>& env,
    const RankIdentity& identity, absl::Duration timeout, int runs = 3);

}  // namespace loom::worker

#endif  // LOOM_WORKER_AGENT_DEVICE_MEASUREMENT_H_
