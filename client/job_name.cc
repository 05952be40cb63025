#include "client/job_name.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace loom::client {

absl::StatusOr<std::string> NormalizeJobName(absl::string_view arg) {
  absl::string_view id = arg;
  if (absl::StartsWith(id, "jobs/")) id.remove_prefix(5);
  bool bad = id.empty();
  for (char c : id) {
    if (c == '/' || absl::ascii_isspace(static_cast<unsigned char>(c)) ||
        absl::ascii_iscntrl(static_cast<unsigned char>(c))) {
      bad = true;
    }
  }
  if (bad) {
    return absl::InvalidArgumentError(
        absl::StrCat("JOB '", arg, "' is not a job name; give it as 'abc' or 'jobs/abc' ",
                     "(see 'loomctl list')"));
  }
  return absl::StrCat("jobs/", id);
}

absl::string_view ShortJobId(absl::string_view name) {
  if (absl::StartsWith(name, "jobs/")) name.remove_prefix(5);
  return name;
}

}  // namespace loom::client
