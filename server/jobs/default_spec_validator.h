// Binds the job manager's SpecValidator to ValidateJobSpec (server/jobs/spec_validator.h): the
// capacity of READY nodes as the node registry counts it, and the operator's path roots.
#pragma once

#include "server/jobs/job_manager.h"
#include "server/jobs/spec_validator.h"

namespace loom::jobs {

// `policy`: loomd's --data-roots and --checkpoint-roots (empty: syntactic path checks only).
SpecValidator MakeSpecValidator(SpecPolicy policy = {});

}  // namespace loom::jobs
