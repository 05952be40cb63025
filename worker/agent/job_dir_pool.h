// JobDirPool: job directories made before a gang needs them.
//
// Starting a gang used to begin with the file system: mkdir of <work>/jobs/<id>/ and of its
// checkpoints/, then spec.json written through a temp file and a rename. Three new inodes, on
// the path between one gang's end and the next one's start; on the bench machine's ext4 that
// was 0.43 ms of the 0.91 ms per job in Supervisor::LaunchJob (perf samples, 100 gangs), at a
// moment when loomd and the ranks were not running.
//
// A spare is <work>/spare-job-dirs/<n>/ holding an empty checkpoints/ and an empty spec.json,
// made by the worker in a folder only it may enter (0700), so no rank can reach a spare. Take()
// writes the spec into a spare's spec.json, then renames the spare to the job's directory with
// RENAME_NOREPLACE: the directory appears whole, spec included, or not at all. Refill() makes
// one spare when fewer than the target are ready; the supervisor calls it when no rank is alive
// (a gang has just ended and loomd is placing the next one) or when none is left.
//
// Take() declines, and the caller prepares the directory itself as before, when no spare is
// ready, when the job's directory exists already (a restarted gang), or when the file system
// refuses; a refusal other than "exists" (no RENAME_NOREPLACE, another file system under
// jobs/, a full disk) stops the pool for good, once logged, so nothing is tried twice per job.
//
// Threading: not thread-safe; the supervisor's loop thread owns it.
#pragma once

#include <deque>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace loom::worker {

class JobDirPool {
 public:
  // Spares live in <work_dir>/spare-job-dirs/ and become <work_dir>/jobs/<id>/. `target` spares
  // are kept ready; 0 turns the pool off.
  JobDirPool(std::string work_dir, int target);

  // Creates <work_dir>/spare-job-dirs/ (0700) and <work_dir>/jobs/, or removes the spares an
  // earlier worker left (numbered folders; nothing else, and only from a folder owned by this
  // worker's user). On failure the pool stays off (the error says why): a relative or empty
  // work dir, or a spare-job-dirs that is not this worker's folder.
  absl::Status Init();

  // Makes one spare when fewer than the target are ready and the pool is on; otherwise returns
  // at once. A failure turns the pool off (logged once).
  void Refill();

  // Turns the spare into `job_dir` (which must be <work_dir>/jobs/<id>) with `spec_json` as its
  // spec.json. Returns true when `job_dir` now exists that way; false when the caller must
  // prepare it itself (see above), with nothing changed under jobs/.
  bool Take(const std::string& job_dir, std::string_view spec_json);

  int ready() const { return static_cast<int>(spares_.size()); }
  bool enabled() const { return enabled_; }

 private:
  void Disable(const absl::Status& why);

  const std::string work_dir_;
  const std::string spare_root_;  // <work_dir>/spare-job-dirs (empty when work_dir_ is)
  const std::string jobs_root_;   // <work_dir>/jobs
  const int target_;
  bool enabled_ = false;  // set by a successful Init()
  std::deque<std::string> spares_;
  int64_t next_ = 0;  // names the next spare
};

}  // namespace loom::worker
