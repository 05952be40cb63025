// `loomctl scale-test`: runs a scaling sweep in loomd (ScalingService, scaling.proto) and shows
// it: the table (or the ScaleTest as JSON / YAML) and, with --plot, an SVG figure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/commands.h"
#include "loom/v1/scaling.pb.h"

namespace loom::client {

struct ScaleTestArgs {
  std::string file;        // the YAML spec; "-" for standard input
  std::string devices;     // "1,2,4,8"
  bool weak = false;       // scale the global batch with the devices
  int64_t steps = 0;       // steps per copy; 0: the server's default (20)
  std::string plot;        // an SVG file to write; empty: none
  std::string request_id;  // idempotency key; a fresh random one when empty
  absl::Duration poll = absl::Milliseconds(500);
};

// "1,2,4" -> {1, 2, 4}. INVALID_ARGUMENT naming --devices and the fix unless every entry is a
// positive integer, strictly increasing, at most 8 entries (the cluster's size is checked by
// loomd).
absl::StatusOr<std::vector<int>> ParseDevicesFlag(const std::string& text);

// The sweep as a table: one row per size (layout, step, tokens/s, efficiency, the lost time's
// buckets as a share of the step), then its SCALING findings with their fixes.
std::string FormatScaleTest(const loom::v1::ScaleTest& test);

// Creates the sweep, follows it to its end (progress on stderr), prints it and writes the plot.
// Exit code 0 when it succeeded (SCALING findings included), 1 when it failed or was cancelled.
int RunScaleTest(CommandContext& ctx, const ScaleTestArgs& args);

}  // namespace loom::client
