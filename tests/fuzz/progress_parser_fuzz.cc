// Fuzz target: the worker's parser of the progress lines a rank prints (worker/agent/
// progress_parser.cc). Its contract: whatever a rank prints, the worker gets a report, nothing
// (another event) or an error, and never crashes. A report it returns must be one the worker
// can send: finite numbers and non-negative counts.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "worker/agent/progress_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  auto report = loom::worker::ParseProgressLine(line);
  if (report.ok() && report->has_value()) {
    const loom::v1::StepReport& r = **report;
    if (r.step() < 0 || r.total_steps() < 0 || !std::isfinite(r.loss()) ||
        !std::isfinite(r.step_seconds()) || !std::isfinite(r.tokens_per_second())) {
      std::abort();  // a report the contract says cannot come out
    }
  }
  return 0;
}
