#include "worker/agent/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/proto_json.h"
#include "worker/agent/assignment_validator.h"
#include "worker/agent/launcher.h"
#include "worker/agent/line_splitter.h"
#include "worker/agent/progress_parser.h"
#include "worker/agent/rank_environment.h"
#include "worker/agent/rank_exit.h"
#include "worker/agent/stack_dump_capture.h"
#include "worker/agent/write_all.h"

namespace loom::worker {
namespace {

constexpr int kStdout = 0, kStderr = 1, kProgress = 2;
constexpr const char* kStreamNames[] = {"stdout", "stderr", "progress"};
// Without pidfds, exits are found by polling this often.
constexpr absl::Duration kExitPollInterval = absl::Milliseconds(50);
// Per wake-up and fd, so that one chatty rank cannot starve the others.
constexpr size_t kReadBudgetBytes = 1 << 20;
// After a rank exits, what is left in its pipes is read up to this much (a grandchild holding
// the pipe could otherwise keep us reading forever).
constexpr size_t kDrainBudgetBytes = 8 << 20;
constexpr size_t kMaxMessageTailBytes = 1024;
constexpr int kMaxMalformedLogged = 10;

// pidfd_open(2) through syscall(): glibc 2.36's <sys/pidfd.h> lacks C linkage for C++.
int PidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// Creates every unset singular sub-message of the spec (model, train, restart...), so that the
// JSON printer, which prints defaults only inside present messages, shows every field. One level
// only: deeper, presence can carry meaning (parallelism.auto asks the planner to choose).
void FillTopLevelMessages(google::protobuf::Message* m) {
  const google::protobuf::Descriptor* d = m->GetDescriptor();
  const google::protobuf::Reflection* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated() &&
        f->real_containing_oneof() == nullptr) {
      r->MutableMessage(m, f);
    }
  }
}

// Writes `content` to `path` through a temp file and a rename, so a reader never sees half.
// The job's work dir belongs to the rank user once ranks ran there, so whatever a rank left at
// `tmp` (e.g. a symbolic link to a system file) is removed first and the file is created anew,
// never followed: the worker may be root. On failure *error_number is the errno (0 when
// unknown).
absl::Status WriteFileAtomically(const std::string& path, const std::string& content,
                                 int* error_number) {
  const std::string tmp = path + ".tmp";
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) {
    *error_number = errno;
    return absl::InternalError(absl::StrCat("unlink ", tmp, ": ", ErrnoText(errno)));
  }
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error_number = errno;
    return absl::InternalError(absl::StrCat("create ", tmp, ": ", ErrnoText(errno)));
  }
  if (const int err = WriteAllAndClose(fd, content); err != 0) {
    *error_number = err;
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("write ", tmp, ": ", ErrnoText(err)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    *error_number = errno;
    return absl::InternalError(absl::StrCat("rename ", tmp, ": ", ErrnoText(*error_number)));
  }
  return absl::OkStatus();
}

}  // namespace

struct Supervisor::Rank {
  explicit Rank(const loom::v1::RankAssignment& a, size_t max_line)
      : assignment(a),
        splitters{LineSplitter(max_line), LineSplitter(max_line), LineSplitter(max_line)} {}
  loom::v1::RankAssignment assignment;
  pid_t pid = -1;  // also the process group id
  int pidfd = -1;
  bool alive = false;       // launched and not reaped yet
  std::string stop_reason;  // non-empty once the worker asked the rank to stop
  absl::Time kill_deadline = absl::InfiniteFuture();
  bool killed = false;  // SIGKILL sent
  std::array<int, 3> fds = {-1, -1, -1};
  std::array<LineSplitter, 3> splitters;
  std::array<std::vector<std::string>, 2> batch;  // stdout, stderr lines not yet sent
  std::array<size_t, 2> batch_bytes = {0, 0};
  std::array<absl::Time, 2> batch_start = {};
  std::string last_stderr;
  int malformed_progress = 0;
  std::optional<loom::v1::RankStatus> final_status;
  std::optional<StackDumpCapture> dump;  // a stack dump asked for and not yet reported
  int fence_fd = -1;                     // the worker's end of the rank's fence
  absl::Time next_fence;                 // when the next byte goes on it
};

struct Supervisor::Job {
  loom::v1::Assignment assignment;
  std::vector<std::unique_ptr<Rank>> ranks;
  // A newer generation waiting for this one's ranks to be reaped.
  std::optional<loom::v1::Assignment> next;
};

struct Supervisor::Finished {
  std::string job;
  int64_t generation;
  std::vector<loom::v1::RankStatus> statuses;
};

Supervisor::Supervisor(SupervisorOptions options, RankEventSink* sink)
    : options_(std::move(options)),
      sink_(sink),
      dir_pool_(options_.work_dir, options_.spare_job_dirs) {}

Supervisor::~Supervisor() {
  Shutdown();
  for (int fd : {wake_read_, wake_write_}) {
    if (fd >= 0) ::close(fd);
  }
}

absl::Status Supervisor::Start() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("supervisor self-pipe: ", ErrnoText(errno)));
  }
  wake_read_ = fds[0];
  wake_write_ = fds[1];
  // Helpers for the launches: a core each, up to one per rank of an 8-GPU node.
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  pool_ = std::make_unique<LaunchPool>(std::clamp(cores - 1, 0, 7));
  if (absl::Status pool = dir_pool_.Init(); !pool.ok()) {
    LOOM_LOG(WARNING) << "supervisor: no job directories made ahead of time: " << pool;
  }
  for (int i = 0; i < options_.spare_job_dirs; ++i) dir_pool_.Refill();
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void Supervisor::Post(Command command) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && command.kind != Command::kShutdown) return;
    if (command.kind == Command::kShutdown) stopping_ = true;
    commands_.push_back(std::move(command));
  }
  const char byte = 1;
  // A full pipe already guarantees a wake-up, so EAGAIN is fine.
  [[maybe_unused]] ssize_t n = ::write(wake_write_, &byte, 1);
}

void Supervisor::Assign(loom::v1::Assignment assignment) {
  Post(Command{Command::kAssign, std::move(assignment), "", 0, ""});
}

void Supervisor::DumpStacks(const std::string& job, int64_t generation) {
  Command c{Command::kDumpStacks, {}, job, generation, ""};
  Post(std::move(c));
}

void Supervisor::Cancel(const std::string& job, int64_t generation, const std::string& reason,
                        bool checkpoint) {
  Post(Command{Command::kCancel, {}, job, generation, reason, checkpoint});
}

std::vector<loom::v1::RunningJob> Supervisor::RunningJobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return view_;
}

SupervisorStats Supervisor::stats() const {
  SupervisorStats s;
  s.launches = launches_.load();
  s.exits_success = exits_[loom::v1::EXIT_CLASS_SUCCESS].load();
  s.exits_retryable = exits_[loom::v1::EXIT_CLASS_RETRYABLE].load();
  s.exits_permanent = exits_[loom::v1::EXIT_CLASS_PERMANENT].load();
  s.exits_stopped = exits_[loom::v1::EXIT_CLASS_STOPPED].load();
  s.running_ranks = running_ranks_.load();
  return s;
}

void Supervisor::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    if (!thread_.joinable()) return;
    Post(Command{Command::kShutdown, {}, "", 0, ""});
    thread_.join();
    pool_.reset();  // after the loop: every rank has exited (the death signal, launch_pool.h)
  });
}

void Supervisor::Loop() {
  std::vector<pollfd> fds;
  // (job, rank, which) for each pollfd after the first; which == 3 means the pidfd.
  std::vector<std::tuple<Job*, Rank*, int>> owners;
  for (;;) {
    // Retire ended jobs first, so that a command sees only generations that still run.
    FinishJobs();
    std::deque<Command> commands;
    {
      std::lock_guard<std::mutex> lock(mu_);
      commands.swap(commands_);
    }
    for (Command& c : commands) {
      switch (c.kind) {
        case Command::kAssign:
          if (!shutting_down_) HandleAssign(std::move(c.assignment));
          break;
        case Command::kCancel:
          HandleCancel(c);
          break;
        case Command::kDumpStacks:
          HandleDumpStacks(c);
          break;
        case Command::kShutdown:
          if (!shutting_down_) {
            shutting_down_ = true;
            LOOM_LOG(INFO) << "supervisor: shutting down, stopping " << jobs_.size() << " job(s)";
            for (auto& [name, job] : jobs_) {
              if (job->next) {
                FailAssignment(*job->next, loom::v1::EXIT_CLASS_STOPPED,
                               "not started: the worker is shutting down");
                job->next.reset();
              }
              // The node drains: keep the work (loomd re-queues the gang without a restart).
              StopJob(*job, "the worker is shutting down", /*checkpoint=*/true);
            }
          }
          break;
      }
    }
    FinishJobs();
    if (shutting_down_ && jobs_.empty()) break;

    // Build the poll set and the timeout.
    fds.clear();
    owners.clear();
    fds.push_back({wake_read_, POLLIN, 0});
    owners.emplace_back(nullptr, nullptr, -1);
    const absl::Time now = absl::Now();
    absl::Time wake_at = now + absl::Seconds(1);
    for (auto& [name, job] : jobs_) {
      for (auto& rank : job->ranks) {
        for (int which = 0; which < 3; ++which) {
          if (rank->fds[which] >= 0) {
            fds.push_back({rank->fds[which], POLLIN, 0});
            owners.emplace_back(job.get(), rank.get(), which);
          }
        }
        for (int which : {kStdout, kStderr}) {
          if (!rank->batch[which].empty()) {
            wake_at = std::min(wake_at, rank->batch_start[which] + options_.log_flush_interval);
          }
        }
        if (!rank->alive) continue;
        if (rank->pidfd >= 0) {
          fds.push_back({rank->pidfd, POLLIN, 0});
          owners.emplace_back(job.get(), rank.get(), 3);
        } else {
          wake_at = std::min(wake_at, now + kExitPollInterval);
        }
        if (!rank->stop_reason.empty() && !rank->killed) {
          wake_at = std::min(wake_at, rank->kill_deadline);
        }
        if (rank->dump.has_value()) wake_at = std::min(wake_at, rank->dump->deadline);
        if (rank->fence_fd >= 0) wake_at = std::min(wake_at, rank->next_fence);
      }
    }
    const int timeout_ms = static_cast<int>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(wake_at - now) + 1, 0, 1000));
    FlushStatuses();  // what the commands above started or stopped, before waiting
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) {
      LOOM_LOG(ERROR) << "supervisor: poll: " << ErrnoText(errno);
      absl::SleepFor(absl::Milliseconds(10));
    }
    if (ready > 0) {
      if (fds[0].revents != 0) {
        char buf[256];
        while (::read(wake_read_, buf, sizeof(buf)) > 0) {
        }
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        auto [job, rank, which] = owners[i];
        if (fds[i].revents == 0 || which == 3) continue;
        ReadPipe(*job, *rank, which, kReadBudgetBytes);
      }
    }

    // Exits: every live rank is checked with waitid(WNOWAIT), which is cheap and also covers
    // ranks whose pidfd fired. The zombie stays until Reap(), which kills its group first.
    for (auto& [name, job] : jobs_) {
      for (auto& rank : job->ranks) {
        if (!rank->alive) continue;
        siginfo_t info{};
        if (::waitid(P_PID, rank->pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
            info.si_pid == rank->pid) {
          Reap(*job, *rank);
        }
      }
    }

    // Escalate stops past their grace, and send log batches that are old enough.
    const absl::Time after = absl::Now();
    for (auto& [name, job] : jobs_) {
      for (auto& rank : job->ranks) {
        if (rank->alive && !rank->stop_reason.empty() && !rank->killed &&
            after >= rank->kill_deadline) {
          LOOM_LOG(INFO) << "supervisor: " << name << " rank " << rank->assignment.rank()
                         << " did not stop within the grace; SIGKILL";
          ::kill(-rank->pid, SIGKILL);
          rank->killed = true;
        }
        for (int which : {kStdout, kStderr}) {
          if (!rank->batch[which].empty() &&
              after >= rank->batch_start[which] + options_.log_flush_interval) {
            FlushLogs(*job, *rank, which);
          }
        }
        if (rank->dump.has_value() && after >= rank->dump->deadline) {
          FinishDump(*job, *rank, /*answered=*/false);
        }
        if (rank->fence_fd >= 0 && after >= rank->next_fence) {
          // "The worker lives." A full buffer (a rank that does not read it) or a gone rank is
          // fine: only silence matters to the rank.
          (void)::send(rank->fence_fd, "\n", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
          rank->next_fence = after + options_.fence_interval;
        }
      }
    }
    FlushStatuses();  // the exits found in this pass, as one burst
    // With no rank alive, a gang has just ended and loomd is placing the next one: the time to
    // make its directory ahead. With ranks alive, only when none is ready.
    if (running_ranks_.load() == 0 || dir_pool_.ready() == 0) dir_pool_.Refill();
  }
  FlushStatuses();
  PublishView();
  LOOM_LOG(INFO) << "supervisor: every rank has stopped";
}

void Supervisor::HandleAssign(loom::v1::Assignment a) {
  const std::string name = a.job();
  auto it = jobs_.find(name);
  if (it != jobs_.end()) {
    Job& job = *it->second;
    const int64_t running = job.assignment.generation();
    if (a.generation() == running || (job.next && a.generation() == job.next->generation())) {
      LOOM_LOG(INFO) << "supervisor: " << name << " generation " << a.generation()
                     << " is already assigned; ignoring the repeat";
    } else if (a.generation() < running) {
      LOOM_LOG(WARNING) << "supervisor: ignoring stale " << name << " generation " << a.generation()
                        << " (running " << running << ")";
    } else {
      LOOM_LOG(INFO) << "supervisor: " << name << " generation " << a.generation()
                     << " supersedes generation " << running << "; stopping it first";
      StopJob(job, absl::StrCat("superseded by generation ", a.generation()));
      if (!job.next || job.next->generation() < a.generation()) job.next = std::move(a);
    }
    return;
  }
  for (const Finished& f : finished_) {
    if (f.job != name) continue;
    if (f.generation == a.generation()) {
      LOOM_LOG(INFO) << "supervisor: " << name << " generation " << a.generation()
                     << " already ran here; re-sending its final statuses";
      for (const loom::v1::RankStatus& s : f.statuses) pending_statuses_.push_back(s);
      return;
    }
  }
  LaunchJob(std::move(a));
}

void Supervisor::HandleCancel(const Command& c) {
  auto it = jobs_.find(c.job);
  if (it == jobs_.end()) return;
  Job& job = *it->second;
  const std::string reason = c.reason.empty() ? "cancelled" : absl::StrCat("cancelled: ", c.reason);
  if (job.next && (c.generation == 0 || c.generation == job.next->generation())) {
    FailAssignment(*job.next, loom::v1::EXIT_CLASS_STOPPED, absl::StrCat("not started: ", reason));
    job.next.reset();
  }
  if (c.generation == 0 || c.generation == job.assignment.generation()) {
    StopJob(job, reason, c.checkpoint);
  }
}

void Supervisor::HandleDumpStacks(const Command& c) {
  auto it = jobs_.find(c.job);
  if (it == jobs_.end() || it->second->assignment.generation() != c.generation) return;
  Job& job = *it->second;
  LOOM_LOG(WARNING) << "supervisor: loomd finds " << c.job << " generation " << c.generation
                    << " hung; asking its ranks for their stacks";
  for (auto& rank : job.ranks) {
    if (!rank->alive || rank->dump.has_value()) continue;
    rank->dump.emplace();
    rank->dump->deadline = absl::Now() + options_.stack_dump_wait;
    const std::string state = ProcState(rank->pid);
    // A stopped process cannot answer until continued; a zombie never will.
    if (state == "T" || state == "t" || state == "Z" || ::kill(rank->pid, SIGUSR1) != 0) {
      FinishDump(job, *rank, /*answered=*/false);
    }
  }
}

void Supervisor::FinishDump(const Job& job, Rank& rank, bool answered) {
  if (!rank.dump.has_value()) return;
  loom::v1::StackDump d;
  d.set_job(job.assignment.job());
  d.set_generation(job.assignment.generation());
  d.set_rank(rank.assignment.rank());
  d.set_pid(rank.pid);
  d.set_answered(answered);
  d.set_proc_state(rank.alive ? ProcState(rank.pid) : "exited");
  d.set_text(std::move(rank.dump->text));
  rank.dump.reset();
  if (!answered) {
    LOOM_LOG(WARNING) << "supervisor: " << d.job() << " rank " << d.rank() << " (pid " << d.pid()
                      << ") did not answer the stack dump; process state " << d.proc_state();
  }
  FlushStatuses();
  sink_->OnStackDump(d);
}

void Supervisor::FailAssignment(const loom::v1::Assignment& a, loom::v1::ExitClass exit_class,
                                const std::string& message, const std::string& prepare_error,
                                bool no_space) {
  Finished finished{a.job(), a.generation(), {}};
  std::vector<int> ranks;
  for (const auto& r : a.ranks()) {
    if (std::find(ranks.begin(), ranks.end(), r.rank()) == ranks.end()) ranks.push_back(r.rank());
  }
  if (ranks.empty()) ranks.push_back(-1);  // no rank to blame: -1 stands for "the assignment"
  for (int rank : ranks) {
    loom::v1::RankStatus s;
    s.set_job(a.job());
    s.set_generation(a.generation());
    s.set_rank(rank);
    s.set_phase(loom::v1::RANK_PHASE_EXITED);
    s.set_exit_code(-1);
    s.set_exit_class(exit_class);
    s.set_message(message);
    s.set_prepare_error(prepare_error);
    s.set_no_space(no_space);
    finished.statuses.push_back(s);
    EmitExit(std::move(s));
  }
  finished_.push_back(std::move(finished));
  while (finished_.size() > options_.finished_history) finished_.pop_front();
}

absl::Status Supervisor::GiveToRankUser(const RankPaths& paths) const {
  const RankIdentity& user = options_.rank_user;
  if (!user.switch_user) return absl::OkStatus();
  // The folders the worker created for the job, never their contents: what is inside was
  // written by the ranks (already theirs) or by the worker for them to read (spec.json), and a
  // recursive chown as root could be steered by a rank's hard links onto files it must not own.
  for (const std::string& dir : {paths.work_dir, paths.checkpoint_dir}) {
    struct stat info {};
    int err = 0;
    if (::lstat(dir.c_str(), &info) != 0) {
      err = errno;
    } else if (!S_ISDIR(info.st_mode)) {
      err = ENOTDIR;  // e.g. a link a rank put in place of its checkpoint folder
    } else if (::lchown(dir.c_str(), user.uid, user.gid) != 0) {
      err = errno;
    }
    if (err != 0) {
      return absl::InternalError(
          absl::StrCat("chown ", dir, " to ", user.name, ": ", ErrnoText(err)));
    }
  }
  return absl::OkStatus();
}

void Supervisor::LaunchJob(loom::v1::Assignment a) {
  if (absl::Status valid = ValidateAssignment(a, options_.devices); !valid.ok()) {
    LOOM_LOG(WARNING) << "supervisor: refusing an invalid assignment: " << valid.message();
    FailAssignment(a, loom::v1::EXIT_CLASS_PERMANENT,
                   absl::StrCat("invalid assignment: ", valid.message()));
    return;
  }
  if (absl::Status confined = CheckSpecPathsOnNode(a.spec(), options_.roots); !confined.ok()) {
    LOOM_LOG(WARNING) << "supervisor: refusing " << a.job() << ": " << confined.message();
    FailAssignment(a, loom::v1::EXIT_CLASS_PERMANENT, std::string(confined.message()));
    return;
  }
  // Validated above, so the id is a safe directory name.
  const std::string job_id = JobIdFromName(a.job()).value();
  RankPaths paths;
  paths.work_dir = absl::StrCat(options_.work_dir, "/jobs/", job_id);
  paths.spec_file = paths.work_dir + "/spec.json";
  // A given checkpoint.dir gets the job's own folder inside it, so that jobs sharing a dir never
  // resume from (or overwrite) each other's checkpoints.
  const bool default_checkpoints = a.spec().checkpoint().dir().empty();
  paths.checkpoint_dir = default_checkpoints
                             ? paths.work_dir + "/checkpoints"
                             : absl::StrCat(a.spec().checkpoint().dir(), "/", job_id);

  // Every sub-message present, so that spec.json shows every field with its default.
  loom::v1::JobSpec spec = a.spec();
  FillTopLevelMessages(&spec);
  // protobuf's JSON mapping, printed by reflection (common/proto_json.h says why).
  const std::string spec_json = MessageToJson(spec);
  absl::Status prepared = absl::OkStatus();
  int prepare_errno = 0;
  // A spare holds the default checkpoints/ only; a job with its own checkpoint.dir, a restarted
  // gang (its directory exists) and a worker without spares prepare the directory here.
  if (!default_checkpoints || !dir_pool_.Take(paths.work_dir, spec_json)) {
    std::error_code ec;
    for (const std::string& dir : {paths.work_dir, paths.checkpoint_dir}) {
      if (!prepared.ok()) break;
      std::filesystem::create_directories(dir, ec);
      if (ec) {
        prepare_errno = ec.value();
        prepared = absl::InternalError(
            absl::StrCat("mkdir ", dir, ": ", ec.message(), " (errno ", ec.value(), ")"));
      }
    }
    if (prepared.ok()) prepared = WriteFileAtomically(paths.spec_file, spec_json, &prepare_errno);
  }
  if (prepared.ok()) prepared = GiveToRankUser(paths);
  if (!prepared.ok()) {
    // The node's disk, not the job: loomd re-places the gang elsewhere (without spending a
    // restart) and, when the disk is full, marks this node unhealthy.
    LOOM_LOG(ERROR) << "supervisor: cannot prepare " << a.job() << ": " << prepared.message();
    FailAssignment(a, loom::v1::EXIT_CLASS_RETRYABLE,
                   absl::StrCat("preparing the job directory: ", prepared.message()),
                   std::string(prepared.message()),
                   prepare_errno == ENOSPC || prepare_errno == EDQUOT);
    return;
  }

  // In jobs_ from the start, so that RunningJobs() includes each rank before its RUNNING status
  // goes out.
  std::unique_ptr<Job>& slot = jobs_[a.job()];
  slot = std::make_unique<Job>();
  Job* job = slot.get();
  job->assignment = std::move(a);
  const loom::v1::Assignment& as = job->assignment;
  std::vector<loom::v1::RankAssignment> order(as.ranks().begin(), as.ranks().end());
  std::sort(order.begin(), order.end(),
            [](const auto& x, const auto& y) { return x.local_rank() < y.local_rank(); });
  for (const auto& ra : order) {
    job->ranks.push_back(std::make_unique<Rank>(ra, options_.max_line_bytes));
  }

  LOOM_LOG(INFO) << "supervisor: launching " << as.job() << " generation " << as.generation()
                 << " with " << order.size() << " rank(s) of " << as.world_size();
  // Every rank is launched at once (the pool runs the execs side by side), then the results are
  // read in rank order: the first failure names the job's stop reason, and the ranks that did
  // start are stopped with it.
  std::vector<LaunchRequest> requests;
  for (auto& rank : job->ranks) {
    LaunchRequest& request = requests.emplace_back();
    request.program = options_.rank_program;
    request.args = options_.rank_args;
    request.env = options_.inherited_env;
    for (auto& [k, v] : BuildRankEnvironment(as, rank->assignment, paths,
                                             absl::ToInt64Milliseconds(options_.fence_timeout))) {
      request.env[k] = v;
    }
    if (rank->assignment.device_kind() == loom::v1::DEVICE_KIND_CPU &&
        options_.cpu_threads_per_device > 0) {
      DefaultCpuThreads(options_.cpu_threads_per_device, &request.env);
    }
    request.cwd = paths.work_dir;
    request.switch_user = options_.rank_user.switch_user;
    request.uid = options_.rank_user.uid;
    request.gid = options_.rank_user.gid;
    request.groups = options_.rank_user.groups;
  }
  std::vector<absl::StatusOr<LaunchedProcess>> results = pool_->LaunchAll(requests);

  std::string failure;  // the first rank that failed to start
  std::vector<loom::v1::RankStatus> failed;
  // The RUNNING statuses go out together once every rank has been started: one burst that the
  // session writes in one go, instead of a message (and a wake-up on both sides) between
  // consecutive launches. loomd waits for all of them anyway before the job is RUNNING.
  std::vector<Rank*> started;
  for (size_t i = 0; i < job->ranks.size(); ++i) {
    Rank* rank = job->ranks[i].get();
    absl::StatusOr<LaunchedProcess>& launched = results[i];
    if (!launched.ok()) {
      const bool permanent = absl::IsFailedPrecondition(launched.status());
      loom::v1::RankStatus s;
      s.set_job(as.job());
      s.set_generation(as.generation());
      s.set_rank(rank->assignment.rank());
      s.set_phase(loom::v1::RANK_PHASE_EXITED);
      s.set_exit_code(permanent ? 127 : -1);
      s.set_exit_class(permanent ? loom::v1::EXIT_CLASS_PERMANENT : loom::v1::EXIT_CLASS_RETRYABLE);
      s.set_message(std::string(launched.status().message()));
      LOOM_LOG(WARNING) << "supervisor: " << as.job() << " rank " << rank->assignment.rank()
                        << " failed to start: " << launched.status().message();
      if (failure.empty()) {
        failure = absl::StrCat("rank ", rank->assignment.rank(),
                               " failed to start: ", launched.status().message());
      }
      rank->final_status = s;
      failed.push_back(std::move(s));
      continue;
    }
    rank->pid = launched->pid;
    rank->fds = {launched->stdout_fd, launched->stderr_fd, launched->progress_fd};
    rank->fence_fd = launched->fence_fd;
    rank->next_fence = absl::Now();
    rank->pidfd = PidfdOpen(rank->pid);  // -1 (ENOSYS...) falls back to waitid polling
    if (rank->pidfd >= 0) ::fcntl(rank->pidfd, F_SETFD, FD_CLOEXEC);
    rank->alive = true;
    launches_.fetch_add(1);
    running_ranks_.fetch_add(1);
    started.push_back(rank);
  }
  PublishView();
  for (Rank* rank : started) EmitStatus(*job, *rank, loom::v1::RANK_PHASE_RUNNING);
  for (loom::v1::RankStatus& s : failed) EmitExit(std::move(s));
  if (!failure.empty()) StopJob(*job, failure);
}

void Supervisor::StopJob(Job& job, const std::string& reason, bool checkpoint) {
  const absl::Time deadline = absl::Now() + options_.stop_grace;
  for (auto& rank : job.ranks) {
    if (!rank->alive || !rank->stop_reason.empty()) continue;
    rank->stop_reason = reason;
    rank->kill_deadline = deadline;
    if (options_.stop_grace <= absl::ZeroDuration()) {
      ::kill(-rank->pid, SIGKILL);
      rank->killed = true;
    } else {
      ::kill(-rank->pid, checkpoint ? SIGUSR2 : SIGTERM);
    }
  }
}

void Supervisor::ReadPipe(Job& job, Rank& rank, int which, size_t budget) {
  char buf[65536];
  while (budget > 0 && rank.fds[which] >= 0) {
    const ssize_t n = ::read(rank.fds[which], buf, std::min(sizeof(buf), budget));
    if (n > 0) {
      budget -= static_cast<size_t>(n);
      rank.splitters[which].Append(
          std::string_view(buf, static_cast<size_t>(n)),
          [&](std::string line) { OnLine(job, rank, which, std::move(line)); });
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    ClosePipe(job, rank, which);  // EOF or a read error
  }
}

void Supervisor::ClosePipe(Job& job, Rank& rank, int which) {
  if (rank.fds[which] < 0) return;
  rank.splitters[which].Flush([&](std::string line) { OnLine(job, rank, which, std::move(line)); });
  ::close(rank.fds[which]);
  rank.fds[which] = -1;
}

void Supervisor::OnLine(Job& job, Rank& rank, int which, std::string line) {
  const loom::v1::Assignment& a = job.assignment;
  if (which == kProgress) {
    absl::StatusOr<std::optional<loom::v1::StepReport>> report = ParseProgressLine(line);
    if (!report.ok()) {
      if (++rank.malformed_progress <= kMaxMalformedLogged) {
        LOOM_LOG(WARNING) << "supervisor: " << a.job() << " rank " << rank.assignment.rank()
                          << ": skipping a malformed progress line: " << report.status().message()
                          << (rank.malformed_progress == kMaxMalformedLogged
                                  ? " (further ones are not logged)"
                                  : "");
      }
      return;
    }
    if (!report->has_value()) return;
    loom::v1::StepReport& r = **report;
    r.set_job(a.job());
    r.set_generation(a.generation());
    r.set_rank(rank.assignment.rank());
    FlushStatuses();
    sink_->OnStepReport(r);
    return;
  }
  if (which == kStderr && !line.empty()) {
    rank.last_stderr = line.substr(0, kMaxMessageTailBytes);
    rank.last_stderr = SanitizeUtf8(rank.last_stderr);  // the cut may split a character
  }
  const bool dump_ended = which == kStderr && rank.dump.has_value() && rank.dump->OnLine(line);
  if (rank.batch[which].empty()) rank.batch_start[which] = absl::Now();
  rank.batch_bytes[which] += line.size();
  rank.batch[which].push_back(std::move(line));
  if (rank.batch[which].size() >= static_cast<size_t>(options_.log_batch_max_lines) ||
      rank.batch_bytes[which] >= options_.log_batch_max_bytes) {
    FlushLogs(job, rank, which);
  }
  if (dump_ended) {
    FlushLogs(job, rank, which);  // the dump's lines go up before its answer
    FinishDump(job, rank, /*answered=*/true);
  }
}

void Supervisor::FlushLogs(Job& job, Rank& rank, int which) {
  if (rank.batch[which].empty()) return;
  loom::v1::LogChunk chunk;
  chunk.set_job(job.assignment.job());
  chunk.set_generation(job.assignment.generation());
  chunk.set_rank(rank.assignment.rank());
  chunk.set_stream(kStreamNames[which]);
  for (std::string& line : rank.batch[which]) chunk.add_lines(std::move(line));
  rank.batch[which].clear();
  rank.batch_bytes[which] = 0;
  FlushStatuses();
  sink_->OnLogChunk(chunk);
}

void Supervisor::Reap(Job& job, Rank& rank) {
  // The leader is a zombie, so its process group id cannot be reused yet: kill whatever the rank
  // left behind in its group before reaping, so no orphan outlives it.
  ::kill(-rank.pid, SIGKILL);
  int status = 0;
  while (::waitpid(rank.pid, &status, 0) < 0 && errno == EINTR) {
  }
  for (int which = 0; which < 3; ++which) {
    ReadPipe(job, rank, which, kDrainBudgetBytes);
    ClosePipe(job, rank, which);
  }
  FlushLogs(job, rank, kStdout);
  FlushLogs(job, rank, kStderr);
  if (rank.pidfd >= 0) ::close(rank.pidfd);
  rank.pidfd = -1;
  if (rank.fence_fd >= 0) ::close(rank.fence_fd);
  rank.fence_fd = -1;
  rank.alive = false;
  FinishDump(job, rank, /*answered=*/false);
  running_ranks_.fetch_sub(1);

  const RankExit exit = ClassifyExit(status, rank.stop_reason, rank.last_stderr);
  loom::v1::RankStatus s;
  s.set_job(job.assignment.job());
  s.set_generation(job.assignment.generation());
  s.set_rank(rank.assignment.rank());
  s.set_phase(loom::v1::RANK_PHASE_EXITED);
  s.set_exit_code(exit.exit_code);
  s.set_signal(exit.signal);
  s.set_exit_class(exit.exit_class);
  s.set_message(exit.message);
  s.set_pid(rank.pid);
  LOOM_LOG(INFO) << "supervisor: " << job.assignment.job() << " generation "
                 << job.assignment.generation() << " rank " << rank.assignment.rank() << " "
                 << loom::v1::ExitClass_Name(exit.exit_class) << ": " << exit.message;
  rank.final_status = s;
  PublishView();  // before the exit is reported, so RunningJobs() never lags the sink
  EmitExit(std::move(s));
  if (exit.exit_class == loom::v1::EXIT_CLASS_RETRYABLE ||
      exit.exit_class == loom::v1::EXIT_CLASS_PERMANENT) {
    StopJob(job, absl::StrCat("rank ", rank.assignment.rank(), " failed (", exit.message, ")"));
  }
}

void Supervisor::EmitStatus(const Job& job, const Rank& rank, loom::v1::RankPhase phase) {
  loom::v1::RankStatus s;
  s.set_job(job.assignment.job());
  s.set_generation(job.assignment.generation());
  s.set_rank(rank.assignment.rank());
  s.set_phase(phase);
  s.set_pid(rank.pid > 0 ? rank.pid : 0);
  pending_statuses_.push_back(std::move(s));
}

void Supervisor::EmitExit(loom::v1::RankStatus status) {
  const int c = status.exit_class();
  if (c >= 0 && c < 5) exits_[c].fetch_add(1);
  pending_statuses_.push_back(std::move(status));
}

void Supervisor::FlushStatuses() {
  if (pending_statuses_.empty()) return;
  std::vector<loom::v1::RankStatus> statuses;
  statuses.swap(pending_statuses_);
  sink_->OnRankStatuses(std::move(statuses));
}

void Supervisor::FinishJobs() {
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Job& job = *it->second;
    const bool any_alive =
        std::any_of(job.ranks.begin(), job.ranks.end(), [](const auto& r) { return r->alive; });
    if (any_alive) {
      ++it;
      continue;
    }
    Finished finished{job.assignment.job(), job.assignment.generation(), {}};
    for (const auto& rank : job.ranks) {
      if (rank->final_status) finished.statuses.push_back(*rank->final_status);
    }
    finished_.push_back(std::move(finished));
    while (finished_.size() > options_.finished_history) finished_.pop_front();
    std::optional<loom::v1::Assignment> next = std::move(job.next);
    it = jobs_.erase(it);
    if (next && !shutting_down_) LaunchJob(std::move(*next));
  }
  PublishView();
}

void Supervisor::PublishView() {
  std::vector<loom::v1::RunningJob> view;
  for (const auto& [name, job] : jobs_) {
    loom::v1::RunningJob running;
    running.set_job(name);
    running.set_generation(job->assignment.generation());
    for (const auto& rank : job->ranks) {
      if (rank->alive) running.add_ranks(rank->assignment.rank());
    }
    if (running.ranks_size() > 0) view.push_back(std::move(running));
  }
  std::lock_guard<std::mutex> lock(mu_);
  view_ = std::move(view);
}

}  // namespace loom::worker
