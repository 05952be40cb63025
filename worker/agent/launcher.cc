#include "worker/agent/launcher.h"

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <optional>

#include "absl/strings/str_cat.h"

namespace loom::worker {
namespace {

// What a child that failed before its exec reports: which step failed, and errno. Written by
// the child into the launching thread's memory (shared until the exec), read once the clone has
// returned.
enum ChildStep : int { kStepSetup = 1, kStepChdir = 2, kStepExec = 3, kStepUser = 4 };
struct ChildError {
  volatile int step = 0;  // volatile: written by another task, read after clone() returns
  volatile int err = 0;
};

void CloseIfOpen(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Everything the child reads, prepared by the parent before the clone.
struct ChildContext {
  const LaunchRequest* request;
  const char* program;
  char* const* argv;
  char* const* envp;
  const char* cwd;  // null: stay in the worker's directory
  int max_fd;
  pid_t parent;
  const SignalSnapshot* signals;       // null: reset every signal
  int devnull, out, err, prog, fence;  // the child's ends
  ChildError* error;                   // the launching thread's, written only on failure
};

// The one write the child makes to the worker's memory, then its end. _exit, not exit: no
// handler of the worker's may run here.
[[noreturn]] void ChildFail(const ChildContext& c, int step) {
  c.error->err = errno;
  c.error->step = step;
  _exit(127);
}

// The child, from the clone to the exec. It runs in the worker's address space (CLONE_VM) on
// its own stack while the cloning thread waits (CLONE_VFORK), so it must not write any memory
// the worker uses but its error report: no allocation, no locks, nothing but system calls on the
// prepared data. The credential changes are raw system calls because glibc's
// setuid/setgid/setgroups would signal every thread on the worker's thread list (they apply the
// change process-wide), which is shared memory here. Signals are blocked from before the clone
// until the dispositions are reset, so no worker handler can run on this stack.
int ChildMain(void* arg) {
  const ChildContext& c = *static_cast<const ChildContext*>(arg);
  const LaunchRequest& request = *c.request;
  if (::setpgid(0, 0) != 0) ChildFail(c, kStepSetup);
  // The user first: a change of credentials clears the parent-death signal set below.
  if (request.switch_user) {
    // Groups first: after setuid the process may no longer change them.
    if (::syscall(SYS_setgroups, request.groups.size(), request.groups.data()) != 0 ||
        ::syscall(SYS_setgid, request.gid) != 0 || ::syscall(SYS_setuid, request.uid) != 0) {
      ChildFail(c, kStepUser);
    }
  }
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) ChildFail(c, kStepSetup);
  if (::getppid() != c.parent) _exit(127);  // the worker died before the death signal was armed
  // Default dispositions first, then the empty mask: a signal delivered in between would run a
  // worker handler here.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  if (c.signals != nullptr) {
    for (int i = 0; i < c.signals->count; ++i) sigaction(c.signals->signals[i], &dfl, nullptr);
  } else {
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);
    }
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  // Move the five fds above the target range first so dup2 cannot clobber one of them.
  int src[5] = {c.devnull, c.out, c.err, c.prog, c.fence};
  for (int& fd : src) {
    fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
    if (fd < 0) ChildFail(c, kStepSetup);
  }
  for (int target = 0; target < 4; ++target) {
    if (::dup2(src[target], target) < 0) ChildFail(c, kStepSetup);
  }
  if (::dup2(src[4], 5) < 0) ChildFail(c, kStepSetup);
  if (::close_range(6, ~0U, 0) != 0) {
    for (int fd = 6; fd < c.max_fd; ++fd) ::close(fd);
  }
  ::close(4);  // the rank contract leaves fd 4 closed
  if (c.cwd != nullptr && ::chdir(c.cwd) != 0) ChildFail(c, kStepChdir);
  ::execve(c.program, c.argv, c.envp);
  ChildFail(c, kStepExec);
}

// The child's stack: it runs only the system calls above.
constexpr size_t kChildStackBytes = 256 * 1024;

void* MapChildStack() {
  void* base = ::mmap(nullptr, kChildStackBytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  return base == MAP_FAILED ? nullptr : base;
}

}  // namespace

ChildStack::ChildStack() : base_(MapChildStack()) {}

ChildStack::~ChildStack() {
  if (base_ != nullptr) ::munmap(base_, kChildStackBytes);
}

char* ChildStack::top() const {
  return base_ == nullptr ? nullptr : static_cast<char*>(base_) + kChildStackBytes;
}

std::string ErrnoText(int err) {
  const char* text = strerrordesc_np(err);
  return text != nullptr ? std::string(text) : absl::StrCat("errno ", err);
}

SignalSnapshot NonDefaultSignals() {
  SignalSnapshot snapshot;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    struct sigaction current {};
    // A number the kernel refuses (glibc's internal real-time signals) is reset by nobody.
    if (::sigaction(sig, nullptr, &current) != 0) continue;
    const bool with_info = (current.sa_flags & SA_SIGINFO) != 0;
    if (with_info || current.sa_handler != SIG_DFL) snapshot.signals[snapshot.count++] = sig;
  }
  return snapshot;
}

absl::StatusOr<LaunchedProcess> Launch(const LaunchRequest& request, ChildStack* stack,
                                       const SignalSnapshot* signals) {
  // Everything the child touches is prepared here: no allocation after fork.
  std::vector<std::string> arg_storage;
  arg_storage.push_back(request.program);
  arg_storage.insert(arg_storage.end(), request.args.begin(), request.args.end());
  std::vector<char*> argv;
  for (std::string& s : arg_storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_storage;
  for (const auto& [name, value] : request.env) env_storage.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& s : env_storage) envp.push_back(s.data());
  envp.push_back(nullptr);
  const char* program = request.program.c_str();
  const char* cwd = request.cwd.empty() ? nullptr : request.cwd.c_str();
  rlimit nofile{};
  const int max_fd = ::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < 1048576
                         ? static_cast<int>(nofile.rlim_cur)
                         : 1048576;

  // [0] read end (parent), [1] write end (child). All close-on-exec until dup2'd in the child.
  int out[2] = {-1, -1}, err[2] = {-1, -1}, prog[2] = {-1, -1};
  // The fence runs the other way: [0] the child's end (fd 5), [1] the parent's. A socket pair
  // rather than a pipe, so that the worker writes with MSG_NOSIGNAL (no SIGPIPE when the rank
  // has gone).
  int fence[2] = {-1, -1};
  int devnull = -1;
  auto close_all = [&] {
    for (int* p : {out, err, prog, fence}) {
      CloseIfOpen(p[0]);
      CloseIfOpen(p[1]);
    }
    CloseIfOpen(devnull);
  };
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fence) != 0) {
    const int e = errno;
    close_all();
    return absl::ResourceExhaustedError(absl::StrCat("socketpair: ", ErrnoText(e)));
  }
  for (int* p : {out, err, prog}) {
    if (::pipe2(p, O_CLOEXEC) != 0) {
      const int e = errno;
      close_all();
      return absl::ResourceExhaustedError(absl::StrCat("pipe: ", ErrnoText(e)));
    }
  }
  devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0) {
    const int e = errno;
    close_all();
    return absl::InternalError(absl::StrCat("open /dev/null: ", ErrnoText(e)));
  }
  ChildError child_error;
  const ChildContext context{&request, program,    argv.data(), envp.data(), cwd,
                             max_fd,   ::getpid(), signals,     devnull,     out[1],
                             err[1],   prog[1],    fence[0],    &child_error};
  std::optional<ChildStack> own_stack;  // only when the caller has none (or its mapping failed)
  if (stack == nullptr || stack->top() == nullptr) stack = &own_stack.emplace();
  if (stack->top() == nullptr) {
    const int e = errno;
    close_all();
    return absl::ResourceExhaustedError(absl::StrCat("mmap of the child's stack: ", ErrnoText(e)));
  }

  // A clone that shares the address space and suspends this thread until the child execs or
  // exits (what posix_spawn does), rather than fork: copying the page tables of a worker with
  // many threads and mappings cost 2-3 ms per rank, and a gang of 8 starts one rank after the
  // other. All signals stay blocked in the child until its dispositions are default.
  sigset_t all, saved;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &saved);
  const pid_t pid = ::clone(ChildMain, stack->top(), CLONE_VM | CLONE_VFORK | SIGCHLD,
                            const_cast<ChildContext*>(&context));
  const int clone_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (pid < 0) {
    close_all();
    return absl::ResourceExhaustedError(absl::StrCat("clone: ", ErrnoText(clone_errno)));
  }

  // Parent. setpgid here too, so that the group exists before Launch() returns whatever the
  // scheduling order (EACCES after the child's exec or ESRCH after its exit are harmless).
  ::setpgid(pid, pid);
  for (int* p : {out, err, prog}) CloseIfOpen(p[1]);
  CloseIfOpen(fence[0]);
  CloseIfOpen(devnull);

  // The child has exec'd or exited (CLONE_VFORK); a child that exited before its exec without a
  // report (its parent died first) is reaped by the caller like any rank.
  const bool failed = child_error.step != 0;
  if (failed) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    for (int* p : {out, err, prog}) CloseIfOpen(p[0]);
    CloseIfOpen(fence[1]);
    const char* step = child_error.step == kStepChdir  ? "chdir "
                       : child_error.step == kStepExec ? "exec "
                       : child_error.step == kStepUser ? "switch to the rank user for "
                                                       : "set up ";
    const std::string& what = child_error.step == kStepChdir ? request.cwd : request.program;
    return absl::FailedPreconditionError(
        absl::StrCat(step, what, ": ", ErrnoText(child_error.err)));
  }
  LaunchedProcess launched;
  launched.pid = pid;
  launched.stdout_fd = out[0];
  launched.stderr_fd = err[0];
  launched.progress_fd = prog[0];
  launched.fence_fd = fence[1];
  for (int fd : {out[0], err[0], prog[0], fence[1]}) {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  return launched;
}

}  // namespace loom::worker
