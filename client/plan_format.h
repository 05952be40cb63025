// `loomctl plan` as a table: one row per plan (rank, tp/pp/dp, micro-batch x count, recompute,
// ZeRO-1, predicted step time, tokens/s, MFU, peak memory per device), the spec's constrained
// layout beside them when it has one, then the rejected families one line each.
#pragma once

#include <string>

#include "loom/v1/job.pb.h"

namespace loom::client {

std::string FormatPlanTable(const loom::v1::PlanJobResponse& response);

// "850 ms", "2.41 s", "95 µs".
std::string FormatStepSeconds(double seconds);

// "1.23M", "45.6k", "812".
std::string FormatRate(double per_second);

}  // namespace loom::client
