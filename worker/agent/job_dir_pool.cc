#include "worker/agent/job_dir_pool.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "worker/agent/launcher.h"
#include "worker/agent/write_all.h"

namespace loom::worker {
namespace {

absl::Status Errno(const std::string& what, const std::string& path, int err) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", ErrnoText(err)));
}

// Writes all of `content` to the existing file at `path`, which is replaced, never followed.
// Not opened with O_TRUNC: the spare's file is empty (Refill made it so), and on ext4 a
// truncation to size 0, even of an empty file, arms "auto_da_alloc", whose close() then starts
// the file's write-back at once (block allocation and an I/O submission, measured on the
// gang's start path). Only a file found non-empty is truncated first.
absl::Status Overwrite(const std::string& path, std::string_view content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Errno("open", path, errno);
  struct stat info {};
  if (::fstat(fd, &info) != 0 || (info.st_size != 0 && ::ftruncate(fd, 0) != 0)) {
    const int err = errno;
    ::close(fd);
    return Errno("truncate", path, err);
  }
  if (const int err = WriteAllAndClose(fd, content); err != 0) return Errno("write", path, err);
  return absl::OkStatus();
}

}  // namespace

JobDirPool::JobDirPool(std::string work_dir, int target)
    : work_dir_(std::move(work_dir)),
      spare_root_(work_dir_.empty() ? "" : work_dir_ + "/spare-job-dirs"),
      jobs_root_(work_dir_ + "/jobs"),
      target_(target) {}

absl::Status JobDirPool::Init() {
  if (target_ <= 0) return absl::OkStatus();
  if (spare_root_.empty() || spare_root_[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("the work dir must be an absolute path, got '", work_dir_, "'"));
  }
  struct stat info {};
  if (::lstat(spare_root_.c_str(), &info) == 0) {
    // Only a folder of this worker's user is taken for the spares' folder, and only what an
    // earlier worker made in it (spares are named by numbers) is removed.
    if (!S_ISDIR(info.st_mode) || info.st_uid != ::geteuid()) {
      return absl::FailedPreconditionError(absl::StrCat(
          spare_root_, " exists but is not a folder of this worker's user; move it away"));
    }
    if (::chmod(spare_root_.c_str(), 0700) != 0) return Errno("chmod", spare_root_, errno);
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(spare_root_, ec)) {
      const std::string name = entry.path().filename().string();
      if (!name.empty() && absl::c_all_of(name, absl::ascii_isdigit)) {
        std::filesystem::remove_all(entry.path(), ec);
        if (ec) break;
      }
    }
    if (ec) return absl::InternalError(absl::StrCat("clear ", spare_root_, ": ", ec.message()));
  } else if (errno != ENOENT) {
    return Errno("stat", spare_root_, errno);
  } else if (::mkdir(spare_root_.c_str(), 0700) != 0) {
    return Errno("mkdir", spare_root_, errno);
  }
  std::error_code ec;
  std::filesystem::create_directories(jobs_root_, ec);
  if (ec) return absl::InternalError(absl::StrCat("mkdir ", jobs_root_, ": ", ec.message()));
  enabled_ = true;
  return absl::OkStatus();
}

void JobDirPool::Disable(const absl::Status& why) {
  if (!enabled_) return;
  enabled_ = false;
  LOOM_LOG(WARNING) << "supervisor: job directories are no longer made ahead of time (" << why
                    << "); each gang's directory is made when it starts, as without spares";
}

void JobDirPool::Refill() {
  if (!enabled_ || ready() >= target_) return;
  const std::string dir = absl::StrCat(spare_root_, "/", next_++);
  // The modes a job directory gets when made on demand (create_directories: 0777 less umask;
  // spec.json 0644).
  absl::Status made = absl::OkStatus();
  if (::mkdir(dir.c_str(), 0777) != 0) {
    made = Errno("mkdir", dir, errno);
  } else if (const std::string checkpoints = dir + "/checkpoints";
             ::mkdir(checkpoints.c_str(), 0777) != 0) {
    made = Errno("mkdir", checkpoints, errno);
  } else {
    const std::string spec = dir + "/spec.json";
    const int fd = ::open(spec.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
      made = Errno("create", spec, errno);
    } else {
      ::close(fd);
    }
  }
  if (!made.ok()) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    Disable(made);
    return;
  }
  spares_.push_back(dir);
}

bool JobDirPool::Take(const std::string& job_dir, std::string_view spec_json) {
  if (!enabled_ || spares_.empty()) return false;
  const std::string& spare = spares_.front();
  if (absl::Status written = Overwrite(spare + "/spec.json", spec_json); !written.ok()) {
    Disable(written);
    return false;
  }
  if (::renameat2(AT_FDCWD, spare.c_str(), AT_FDCWD, job_dir.c_str(), RENAME_NOREPLACE) != 0) {
    const int err = errno;
    // A restarted gang finds its directory in place; the spare waits for the next job (its
    // spec.json is overwritten then).
    if (err != EEXIST) Disable(Errno(absl::StrCat("rename ", spare, " to"), job_dir, err));
    return false;
  }
  spares_.pop_front();
  return true;
}

}  // namespace loom::worker
