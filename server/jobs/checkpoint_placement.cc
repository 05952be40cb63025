#include "server/jobs/checkpoint_placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace loom::jobs {

bool WritesShardedCheckpoints(const v1::Layout& layout) {
  return layout.tensor() > 1 || layout.pipeline() > 1 || (layout.zero1() && layout.data() > 1);
}

namespace {

int64_t WorldSize(const v1::Layout& layout) {
  return int64_t{std::max(1, layout.data())} * std::max(1, layout.tensor()) *
         std::max(1, layout.pipeline());
}

// Data parallelism alone writes whole checkpoints from one rank, but every rank must find the
// one the gang resumes from: ranks on a node without it refuse to start (the ranks compare what
// they see; docs/rank-contract.md), so a restart after a periodic checkpoint would fail the job.
bool ResumesFromCheckpoints(const v1::JobSpec& spec, const v1::Layout& layout) {
  return WorldSize(layout) > 1 && spec.checkpoint().every_steps() > 0;
}

bool MustStayOnOneNode(const v1::JobSpec& spec, const v1::Layout& layout) {
  return spec.checkpoint().dir().empty() &&
         (WritesShardedCheckpoints(layout) || ResumesFromCheckpoints(spec, layout));
}

}  // namespace

int PlacementGroup(const v1::JobSpec& spec, const v1::Layout& layout) {
  if (MustStayOnOneNode(spec, layout)) return static_cast<int>(WorldSize(layout));
  return std::max(1, layout.tensor());
}

absl::Status CheckCheckpointPlacement(const v1::JobSpec& spec, const v1::Layout& layout,
                                      int max_devices_per_node) {
  const int64_t world = WorldSize(layout);
  if (!MustStayOnOneNode(spec, layout) || world <= max_devices_per_node) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "spec.checkpoint.dir: the layout (data ", layout.data(), " × tensor ", layout.tensor(),
      " × pipeline ", layout.pipeline(), layout.zero1() ? ", ZeRO-1" : "",
      WritesShardedCheckpoints(layout)
          ? ") writes each checkpoint in shards from several ranks"
          : ") resumes every rank from the periodic checkpoint rank 0 writes",
      ", and its ", world, " ranks cannot share one node (at most ", max_devices_per_node,
      " devices per ready node), while the default checkpoint dir is private to each node; set "
      "spec.checkpoint.dir to a directory on a file system every node shares (under loomd's "
      "--checkpoint-roots)"));
}

int64_t CommittedCheckpointStep(int64_t reached, int64_t every_steps) {
  if (every_steps <= 0 || reached <= 1) return 0;
  return (reached - 1) / every_steps * every_steps;
}

std::optional<std::string> ResumeNotice(const v1::JobSpec& spec, int64_t generation,
                                        int64_t first_step, int64_t reached) {
  const int64_t resumed = std::max<int64_t>(0, first_step - 1);
  if (generation <= 1 || resumed >= reached) return std::nullopt;
  const int64_t committed = CommittedCheckpointStep(reached, spec.checkpoint().every_steps());
  const std::string head = absl::StrCat("generation ", generation, " started from step ", resumed,
                                        " (earlier generations reached step ", reached, ")");
  if (resumed >= committed) {
    if (resumed > 0) return absl::StrCat(head, ": resumed from the checkpoint of step ", resumed);
    return absl::StrCat(head, ": no checkpoint had been committed",
                        spec.checkpoint().every_steps() > 0
                            ? ""
                            : " (checkpoint.every_steps is 0: only the final step is saved)");
  }
  const std::string where =
      spec.checkpoint().dir().empty()
          ? "checkpoint.dir is unset, so checkpoints stay on the node that wrote them and a gang "
            "restarted on another node cannot see them; set spec.checkpoint.dir to a directory "
            "every node shares"
          : "check that spec.checkpoint.dir is the same shared directory on every node";
  return absl::StrCat(head, ": the checkpoint of step ", committed, " was NOT found, so ",
                      committed - resumed, " steps are trained again; ", where);
}

}  // namespace loom::jobs
