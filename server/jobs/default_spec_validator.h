// Binds the job manager's SpecValidator to ValidateJobSpec (server/jobs/spec_validator.h):
// the capacity of READY nodes as the node registry counts it, and data files probed on the
// local file system (or through an injected probe in tests).
#pragma once

#include <memory>

#include "server/jobs/job_manager.h"
#include "server/jobs/spec_validator.h"

namespace loom::jobs {

// `files` null means LocalFileProbe.
SpecValidator MakeSpecValidator(std::shared_ptr<const FileProbe> files = nullptr);

}  // namespace loom::jobs
