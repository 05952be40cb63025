#include "worker/agent/agent_priority.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/agent/launcher.h"

namespace loom::worker {
namespace {

// The ids of this process's threads (from /proc/self/task); the caller's alone when it cannot
// be read.
std::vector<pid_t> ThreadIds() {
  std::vector<pid_t> ids;
  if (DIR* dir = ::opendir("/proc/self/task"); dir != nullptr) {
    while (const dirent* entry = ::readdir(dir)) {
      char* end = nullptr;
      const long id = std::strtol(entry->d_name, &end, 10);
      if (end != entry->d_name && *end == '\0' && id > 0) ids.push_back(static_cast<pid_t>(id));
    }
    ::closedir(dir);
  }
  if (ids.empty()) ids.push_back(::gettid());
  return ids;
}

}  // namespace

AgentPriority RaiseAgentPriority(int levels) {
  AgentPriority result;
  if (levels <= 0) {
    result.note = "the worker runs at its ranks' priority (--raise-priority=0)";
    return result;
  }
  errno = 0;
  const int base = ::getpriority(PRIO_PROCESS, 0);  // the calling thread's; -1 is a valid value
  if (base == -1 && errno != 0) {
    result.note =
        absl::StrCat("the worker runs at its ranks' priority: getpriority: ", ErrnoText(errno));
    return result;
  }
  const int raised = std::max(-20, base - std::min(levels, 19));
  if (raised == base) {
    result.note = absl::StrCat("the worker already runs at nice ", base, ", the highest priority");
    return result;
  }
  // The caller first: when it is refused, nothing changed.
  if (::setpriority(PRIO_PROCESS, 0, raised) != 0) {
    result.note = absl::StrCat("the worker runs at its ranks' priority (nice ", base,
                               "): raising it needs CAP_SYS_NICE (", ErrnoText(errno), ")");
    return result;
  }
  for (pid_t tid : ThreadIds()) ::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), raised);
  result.rank_nice = base;
  result.note = absl::StrCat("the worker runs at nice ", raised, " and its ranks at nice ", base);
  return result;
}

}  // namespace loom::worker
