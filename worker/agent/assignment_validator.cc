#include "worker/agent/assignment_validator.h"

#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/env_policy.h"

namespace loom::worker {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("assignment.", field, ": ", what));
}

}  // namespace

absl::StatusOr<std::string> JobIdFromName(absl::string_view job_name) {
  constexpr absl::string_view kPrefix = "jobs/";
  if (!absl::StartsWith(job_name, kPrefix)) {
    return Invalid("job", absl::StrCat("\"", job_name.substr(0, 200),
                                       "\" is not a job name of the form jobs/{job}"));
  }
  const absl::string_view id = job_name.substr(kPrefix.size());
  bool ok = !id.empty() && id.size() <= 128 && id != "." && id != "..";
  for (char c : id) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '-' || c == '_' || c == '.');
  }
  if (!ok) {
    return Invalid("job", "the {job} of jobs/{job} must be 1..128 characters of [A-Za-z0-9._-]");
  }
  return std::string(id);
}

absl::Status ValidateAssignment(const loom::v1::Assignment& a,
                                const std::vector<loom::v1::Device>& devices) {
  if (absl::StatusOr<std::string> id = JobIdFromName(a.job()); !id.ok()) return id.status();
  if (a.generation() < 1) return Invalid("generation", "must be >= 1");
  if (a.world_size() < 1 || a.world_size() > kMaxWorldSize) {
    return Invalid("world_size", absl::StrCat(a.world_size(), " is not in 1..", kMaxWorldSize));
  }
  if (a.num_nodes() < 1 || a.num_nodes() > kMaxNodes) {
    return Invalid("num_nodes", absl::StrCat(a.num_nodes(), " is not in 1..", kMaxNodes));
  }
  if (a.node_rank() < 0 || a.node_rank() >= a.num_nodes()) {
    return Invalid("node_rank", absl::StrCat(a.node_rank(), " is not in 0..num_nodes-1"));
  }
  const loom::v1::Layout& l = a.layout();
  if (l.data() < 1 || l.tensor() < 1 || l.pipeline() < 1 || l.micro_batch() < 0 ||
      l.num_micro_batches() < 0) {
    return Invalid("layout", "data, tensor and pipeline must be >= 1 (loomd fills the layout)");
  }
  if (static_cast<int64_t>(l.data()) * l.tensor() * l.pipeline() != a.world_size()) {
    return Invalid("layout",
                   absl::StrCat("data x tensor x pipeline = ", l.data(), " x ", l.tensor(), " x ",
                                l.pipeline(), " differs from world_size ", a.world_size()));
  }
  const int n = a.ranks_size();
  if (n < 1 || n > kMaxRanksPerAssignment || n > a.world_size()) {
    return Invalid("ranks", absl::StrCat(n, " ranks; expected 1..min(world_size, ",
                                         kMaxRanksPerAssignment, ")"));
  }
  std::set<int> ranks, local_ranks;
  std::set<std::pair<int, int>> used_devices;
  for (int i = 0; i < n; ++i) {
    const loom::v1::RankAssignment& r = a.ranks(i);
    const std::string field = absl::StrCat("ranks[", i, "]");
    if (r.rank() < 0 || r.rank() >= a.world_size()) {
      return Invalid(field, absl::StrCat("rank ", r.rank(), " is not in 0..world_size-1"));
    }
    if (!ranks.insert(r.rank()).second) {
      return Invalid(field, absl::StrCat("rank ", r.rank(), " appears twice"));
    }
    if (r.local_rank() < 0 || r.local_rank() >= n || !local_ranks.insert(r.local_rank()).second) {
      return Invalid(field, absl::StrCat("local_rank ", r.local_rank(),
                                         " is not a unique value in 0..", n - 1));
    }
    if (r.device_kind() != loom::v1::DEVICE_KIND_GPU &&
        r.device_kind() != loom::v1::DEVICE_KIND_CPU) {
      return Invalid(field, "device_kind must be GPU or CPU");
    }
    bool found = false;
    for (const loom::v1::Device& d : devices) {
      found = found || (d.kind() == r.device_kind() && d.index() == r.device_index());
    }
    const char* kind = r.device_kind() == loom::v1::DEVICE_KIND_GPU ? "cuda" : "cpu";
    if (!found) {
      return Invalid(field, absl::StrCat("device ", kind, ":", r.device_index(),
                                         " does not exist on this node"));
    }
    if (!used_devices.insert({r.device_kind(), r.device_index()}).second) {
      return Invalid(
          field, absl::StrCat("device ", kind, ":", r.device_index(), " is assigned to two ranks"));
    }
  }
  // The same deny-list and limits as loomd's (defence in depth).
  if (absl::Status env = CheckSpecEnv(a.spec().env(), "spec.env"); !env.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("assignment.", env.message()));
  }
  return absl::OkStatus();
}

}  // namespace loom::worker
