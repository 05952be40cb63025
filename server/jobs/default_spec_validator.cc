#include "server/jobs/default_spec_validator.h"

#include <utility>

#include "common/status_macros.h"

namespace loom::jobs {

SpecValidator MakeSpecValidator(SpecPolicy policy) {
  return
      [policy = std::move(policy)](const v1::JobSpec& spec,
                                   const nodes::Capacity& ready) -> absl::StatusOr<AcceptedSpec> {
        ClusterCapacity capacity;
        capacity.gpu.total = ready.gpus;
        capacity.gpu.max_per_node = ready.max_gpus_per_node;
        capacity.cpu.total = ready.cpu_devices;
        capacity.cpu.max_per_node = ready.max_cpu_devices_per_node;
        capacity.ready_nodes = ready.ready_nodes;
        ASSIGN_OR_RETURN(ValidatedSpec validated, ValidateJobSpec(spec, capacity, policy));
        return AcceptedSpec{std::move(validated.spec), std::move(validated.layout)};
      };
}

}  // namespace loom::jobs
