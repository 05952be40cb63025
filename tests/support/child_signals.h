// What a test's child process inherits besides its files: the blocked signal mask and the
// signals its parent ignores (both survive exec; caught handlers do not). A test suite started
// by a CI runner, a Python harness (which ignores SIGPIPE), nohup or a container init can
// inherit ignored SIGPIPE, SIGINT or SIGTERM, or a blocked mask, and would pass them on to the
// processes it starts, which then behave unlike under an ordinary shell (a rank that survives
// SIGPIPE only because the harness ignored it, a daemon deaf to SIGTERM). The helpers here give
// every child the defaults, as loom-worker's launcher does for real ranks, so a test sees the
// same process whatever started it; a child that must ignore a signal (every rank ignores
// SIGPIPE) has to do so itself.
#ifndef LOOM_TESTS_SUPPORT_CHILD_SIGNALS_H_
#define LOOM_TESTS_SUPPORT_CHILD_SIGNALS_H_

#include <signal.h>
#include <spawn.h>

namespace loom::testing {

// In a child between fork and exec: empties the signal mask and sets every signal's action to
// the default. Async-signal-safe (sigprocmask, sigaction), so it may run in the child of a
// multithreaded test. Signals the kernel refuses to change (SIGKILL, SIGSTOP, those glibc
// reserves) are left as they are.
inline void ResetSignalsForExec() {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);
  }
}

// The same for posix_spawn: sets `attr` (initialised by the caller) to spawn with an empty mask
// and every signal at its default action. Returns posix_spawnattr_*'s error, 0 on success.
inline int SetDefaultSignals(posix_spawnattr_t* attr) {
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  int rc = posix_spawnattr_setsigdefault(attr, &all);
  if (rc == 0) rc = posix_spawnattr_setsigmask(attr, &none);
  if (rc == 0) rc = posix_spawnattr_setflags(attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  return rc;
}

}  // namespace loom::testing

#endif  // LOOM_TESTS_SUPPORT_CHILD_SIGNALS_H_
