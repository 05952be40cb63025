// `loomctl doctor JOB` as a table: the doctor's raised findings (kind, severity, subject, what,
// fix, predicted gain, evidence), the pending ones, and per stage and per rank medians.
// Pure formatting.
#pragma once

#include <string>

#include "loom/v1/job.pb.h"

namespace loom::client {

std::string FormatJobReport(const loom::v1::JobReport& report);

}  // namespace loom::client
