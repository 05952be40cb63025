// Idempotency keys for CreateJob: a retried submit with the same key returns the first job.
#pragma once

#include <string>

namespace loom::client {

// 128 random bits as 32 lowercase hex digits, from the operating system's entropy source.
std::string NewRequestId();

}  // namespace loom::client
