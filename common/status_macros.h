// Status propagation for the control plane (server/, worker/agent/, client/, common/).
// Error regime: absl::Status / absl::StatusOr, no exceptions; input from the wire or from disk
// never crashes a daemon. (The compute side, kernels/ and worker/train/, checks and exits instead.)
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LOOM_CONCAT_INNER_(a, b) a##b
#define LOOM_CONCAT_(a, b) LOOM_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::absl::Status _loom_status = (expr);          \
    if (!_loom_status.ok()) return _loom_status;   \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());` unwraps an absl::StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  LOOM_ASSIGN_OR_RETURN_IMPL_(LOOM_CONCAT_(_loom_statusor_, __LINE__), lhs, expr)
#define LOOM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
