// Small pure helpers shared by the two halves of the job manager (job_manager.cc: the user
// side; job_manager_workers.cc: the worker side). Internal to server/jobs/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"
#include "google/protobuf/util/time_util.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"

namespace loom::jobs::internal {

// The states in which a job holds devices and its gang runs (or starts).
inline bool IsGangState(v1::JobState state) {
  return state == v1::SCHEDULED || state == v1::RUNNING;
}

inline google::protobuf::Timestamp ToProto(absl::Time t) {
  return google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(absl::ToUnixMicros(t));
}

inline absl::Time FromProto(const google::protobuf::Timestamp& t) {
  return absl::FromUnixMicros(google::protobuf::util::TimeUtil::TimestampToMicroseconds(t));
}

// A short, time-sortable resource id (jobs/{id}, scaletests/{id}): 9 base-32 digits of Unix
// milliseconds, then 4 random ones.
inline std::string NewResourceId(absl::Time now, absl::BitGen& gen) {
  constexpr char kDigits[] = "0123456789abcdefghijklmnopqrstuv";
  uint64_t millis = static_cast<uint64_t>(std::max<int64_t>(0, absl::ToUnixMillis(now)));
  std::string id(13, '0');
  for (int i = 8; i >= 0; --i) {
    id[i] = kDigits[millis % 32];
    millis /= 32;
  }
  for (int i = 9; i < 13; ++i) id[i] = kDigits[absl::Uniform(gen, 0, 32)];
  return id;
}

// "rank 1 killed by signal 9 (SIGKILL)" from a failed rank's status.
inline std::string DescribeExit(const v1::RankStatus& status) {
  if (!status.message().empty()) {
    return absl::StrCat("rank ", status.rank(), " ", status.message());
  }
  if (status.signal() != 0) {
    return absl::StrCat("rank ", status.rank(), " killed by signal ", status.signal());
  }
  return absl::StrCat("rank ", status.rank(), " exited with code ", status.exit_code());
}

inline bool PlacedOn(const v1::Job& job, std::string_view node) {
  for (const v1::Placement& p : job.placements()) {
    if (p.node() == node) return true;
  }
  return false;
}

inline bool RankPlacedOn(const v1::Job& job, std::string_view node, int rank) {
  for (const v1::Placement& p : job.placements()) {
    if (p.node() != node) continue;
    for (int r : p.ranks()) {
      if (r == rank) return true;
    }
  }
  return false;
}

inline std::vector<std::string> PlacementNodes(const v1::Job& job) {
  std::vector<std::string> out;
  for (const v1::Placement& p : job.placements()) out.push_back(p.node());
  return out;
}

}  // namespace loom::jobs::internal
