// Supervisor: runs the ranks of the jobs loomd assigns to this node and reports what they do.
//
// Per Assignment it validates (an invalid one is reported as PERMANENT failures, never run),
// prepares <work-dir>/jobs/<job-id>/ (spec.json, checkpoints/; from a directory made ahead of
// time when one is ready, job_dir_pool.h), launches one process per rank
// through Launch() and then watches them: stdout/stderr lines become LogChunks, progress lines
// StepReports, and each rank's life becomes RankStatus STARTING -> RUNNING -> EXITED.
//
// Gang rule: when a rank of a job fails (RETRYABLE or PERMANENT, including failing to start),
// every other rank of that job on this node is stopped at once: SIGTERM to its process group,
// SIGKILL after `stop_grace`; those report EXITED/STOPPED. loomd stops the other nodes. A cancel
// from loomd and the worker's shutdown stop ranks the same way.
//
// Generations: one generation of a job runs at a time. An assignment for the (job, generation)
// already running, or recently finished, is not launched again (for a finished one the final
// statuses are re-sent, so a loomd that lost them learns the outcome); an older generation is
// ignored as stale; a newer one first stops the running generation and starts when every one of
// its ranks has been reaped.
//
// Threading: one loop thread owns every rank, job and fd, and does all the forking, reading and
// reaping. It is long-lived on purpose: PR_SET_PDEATHSIG fires when the forking *thread* exits.
// It multiplexes every pipe with poll() rather than a thread per pipe: three pipes per rank on a
// node of 8+ GPUs would be dozens of threads, each needing locks around the shared rank state,
// while one poll loop keeps all state single-threaded and bounds the worker's thread count no
// matter how much the ranks print. Exits are noticed through a pidfd per rank (in the same poll
// set), or by polling waitid() every 50 ms where pidfds are unavailable. The public methods are
// thread-safe: they queue a command and wake the loop through a self-pipe.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "loom/v1/node.pb.h"
#include "worker/agent/job_dir_pool.h"
#include "worker/agent/launch_pool.h"
#include "worker/agent/path_confinement.h"
#include "worker/agent/rank_environment.h"
#include "worker/agent/rank_event_sink.h"
#include "worker/agent/rank_user.h"

namespace loom::worker {

struct SupervisorOptions {
  // Root of the per-job directories (<work_dir>/jobs/<job-id>/). Must exist.
  std::string work_dir;
  // The rank program (absolute path) and extra arguments.
  std::string rank_program;
  std::vector<std::string> rank_args;
  // SIGTERM, then SIGKILL after this.
  absl::Duration stop_grace = absl::Seconds(10);
  // Variables every rank inherits below the contract's (see rank_environment.h).
  std::map<std::string, std::string> inherited_env;
  // OMP_NUM_THREADS and OPENBLAS_NUM_THREADS of each CPU rank where neither spec.env nor
  // inherited_env sets them (CpuThreadsPerDevice in rank_environment.h); 0 leaves them unset.
  int cpu_threads_per_device = 0;
  // The node's devices: assignments naming any other device are refused.
  std::vector<loom::v1::Device> devices;
  // Where spec paths may point on this node (--data-roots, --checkpoint-roots; empty lists allow
  // any path), checked with symbolic links resolved before anything is launched.
  PathRoots roots;
  // Who the ranks run as (--rank-user); the job's directories created here are given to it.
  RankIdentity rank_user;
  // Bounds on log lines and on LogChunk batches; a batch is sent when full or this old.
  size_t max_line_bytes = 16 * 1024;
  int log_batch_max_lines = 256;
  size_t log_batch_max_bytes = 256 * 1024;
  absl::Duration log_flush_interval = absl::Milliseconds(200);
  // Self-fencing (launcher.h): a byte on each rank's fence every fence_interval; a rank that
  // hears nothing for fence_timeout (LOOM_FENCE_TIMEOUT_MS) stops itself.
  absl::Duration fence_interval = absl::Seconds(1);
  absl::Duration fence_timeout = absl::Seconds(30);
  // How long a rank has to write its stack dump after SIGUSR1.
  absl::Duration stack_dump_wait = absl::Milliseconds(1500);
  // How many finished (job, generation) outcomes are remembered for idempotent re-assignment.
  size_t finished_history = 256;
  // How many job directories are kept ready under <work_dir>/spare-job-dirs/ (job_dir_pool.h);
  // 0 makes each one when its gang starts.
  int spare_job_dirs = 2;
};

// Counters for node metrics; monotonic except running_ranks.
struct SupervisorStats {
  int64_t launches = 0;
  int64_t exits_success = 0;
  int64_t exits_retryable = 0;
  int64_t exits_permanent = 0;
  int64_t exits_stopped = 0;
  int64_t running_ranks = 0;
};

class Supervisor {
 public:
  // `sink` must outlive the Supervisor.
  Supervisor(SupervisorOptions options, RankEventSink* sink);
  // Shuts down (stopping every rank) if still running.
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts the loop thread. INTERNAL when the self-pipe cannot be created. Call once.
  absl::Status Start();

  // Queues an assignment (see the class comment for what happens to it). Thread-safe,
  // non-blocking; ignored after Shutdown().
  void Assign(loom::v1::Assignment assignment);

  // Stops the ranks of `job` if its running generation is `generation` (0: whichever runs), and
  // drops a queued newer generation it names. Unknown jobs are ignored. Thread-safe, non-blocking.
  void Cancel(const std::string& job, int64_t generation, const std::string& reason,
              bool checkpoint = false);

  // Asks every live rank of (job, generation) for its stacks (SIGUSR1) and reports each one's
  // answer, or that it did not answer within `stack_dump_wait` and its /proc state, through
  // RankEventSink::OnStackDump. A rank already stopped (state T) or exiting is reported at once.
  // Unknown jobs and other generations are ignored. Thread-safe, non-blocking.
  void DumpStacks(const std::string& job, int64_t generation);

  // The jobs with at least one live rank process, for the session's hello. Thread-safe.
  std::vector<loom::v1::RunningJob> RunningJobs() const;

  SupervisorStats stats() const;

  // Stops every rank (SIGTERM, SIGKILL after the grace), reports their exits, and joins the loop
  // thread. Blocks for at most about stop_grace plus the time to reap. Idempotent, thread-safe.
  void Shutdown();

 private:
  struct Rank;
  struct Job;
  struct Finished;
  struct Command {
    enum Kind { kAssign, kCancel, kShutdown, kDumpStacks } kind;
    loom::v1::Assignment assignment;
    std::string job;
    int64_t generation = 0;
    std::string reason;
    bool checkpoint = false;  // kCancel: stop with a checkpoint (StopJob)
  };

  void Post(Command command);
  void Loop();

  // Loop-thread-only helpers below.
  void HandleAssign(loom::v1::Assignment assignment);
  void HandleCancel(const Command& command);
  void HandleDumpStacks(const Command& command);
  // Reports the rank's dump (answered or not) and forgets it.
  void FinishDump(const Job& job, Rank& rank, bool answered);
  void LaunchJob(loom::v1::Assignment assignment);
  // Gives the job's work dir and checkpoint folder (not their contents) to the rank user, when
  // ranks run as another user than the worker. INTERNAL with errno otherwise.
  absl::Status GiveToRankUser(const RankPaths& paths) const;
  // Reports every rank of an assignment that cannot start as EXITED with `exit_class` (and
  // RankStatus.prepare_error / no_space when the node could not prepare the job).
  void FailAssignment(const loom::v1::Assignment& assignment, loom::v1::ExitClass exit_class,
                      const std::string& message, const std::string& prepare_error = "",
                      bool no_space = false);
  // Stops every live rank of the job: SIGTERM, or with `checkpoint` SIGUSR2 (the ranks save a
  // checkpoint at a step they agree on, then exit); SIGKILL once stop_grace has passed.
  void StopJob(Job& job, const std::string& reason, bool checkpoint = false);
  void ReadPipe(Job& job, Rank& rank, int which, size_t budget_bytes);
  void ClosePipe(Job& job, Rank& rank, int which);
  void OnLine(Job& job, Rank& rank, int which, std::string line);
  void FlushLogs(Job& job, Rank& rank, int which);
  void Reap(Job& job, Rank& rank);
  // Both queue the status in pending_statuses_; FlushStatuses() hands the queue to the sink in
  // one call. The loop flushes before it waits in poll() and after each pass over the exits,
  // and before any other sink call, so the sink still sees each rank's events in order.
  void EmitStatus(const Job& job, const Rank& rank, loom::v1::RankPhase phase);
  void EmitExit(loom::v1::RankStatus status);
  void FlushStatuses();
  void FinishJobs();
  void PublishView();

  const SupervisorOptions options_;
  RankEventSink* const sink_;

  mutable std::mutex mu_;  // guards commands_, view_, stopping_
  std::deque<Command> commands_;
  std::vector<loom::v1::RunningJob> view_;
  bool stopping_ = false;
  int wake_read_ = -1, wake_write_ = -1;
  std::unique_ptr<LaunchPool> pool_;  // set by Start(), reset after the loop ends
  std::thread thread_;
  std::once_flag shutdown_once_;

  std::atomic<int64_t> launches_{0}, running_ranks_{0};
  std::atomic<int64_t> exits_[5] = {};  // by ExitClass value

  // Loop thread only.
  std::map<std::string, std::unique_ptr<Job>> jobs_;  // by job name; one generation each
  std::vector<loom::v1::RankStatus> pending_statuses_;  // not yet given to sink_
  JobDirPool dir_pool_;  // filled by Start() before the loop, then by the loop
  std::deque<Finished> finished_;
  bool shutting_down_ = false;
};

}  // namespace loom::worker
