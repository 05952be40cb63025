#include "worker/train/checkpoint/retention.h"

#include <cstdio>
#include <filesystem>
#include <system_error>
#include <utility>

#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/checkpoint/fs.h"
#include "worker/train/error.h"

namespace loom::train {

std::vector<std::string> PruneCheckpoints(const std::string& root, int64_t keep) {
  std::vector<std::string> removed;
  if (keep <= 0) return removed;
  const std::vector<std::pair<int64_t, std::string>> all = ListCompleteCheckpoints(root);
  const int64_t excess = static_cast<int64_t>(all.size()) - keep;
  for (int64_t i = 0; i < excess && i + 1 < static_cast<int64_t>(all.size()); ++i) {
    const std::string& dir = all[i].second;
    // The manifest goes first, so that a crash half-way leaves an incomplete directory (not a
    // checkpoint) rather than a checkpoint with missing shards.
    std::error_code ec;
    std::filesystem::remove(dir + "/manifest.json", ec);
    if (!ec) std::filesystem::remove_all(dir, ec);
    if (ec) {
      std::fprintf(stderr, "loom-train: warning: cannot remove old checkpoint %s: %s (errno %d)\n",
                   dir.c_str(), ec.message().c_str(), ec.value());
      continue;
    }
    removed.push_back(dir);
  }
  if (!removed.empty()) {
    try {
      FsyncDir(root);
    } catch (const IoError& e) {
      std::fprintf(stderr, "loom-train: warning: %s\n", e.what());
    }
  }
  return removed;
}

}  // namespace loom::train
