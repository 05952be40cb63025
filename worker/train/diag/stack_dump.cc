#include "worker/train/diag/stack_dump.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "worker/train/comm/collective_log.h"

namespace loom::train {
namespace {

pid_t main_tid = 0;

void WriteAll(const char* text, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, text, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    text += w;
    n -= static_cast<size_t>(w);
  }
}

void WriteText(const char* text) { WriteAll(text, std::strlen(text)); }

void OnSigusr1(int) {
  const int saved_errno = errno;
  const pid_t pid = ::getpid();
  if (static_cast<pid_t>(::syscall(SYS_gettid)) != main_tid) {
    // Not the training loop's thread: hand the signal to it.
    ::syscall(SYS_tgkill, pid, main_tid, SIGUSR1);
    errno = saved_errno;
    return;
  }
  char line[256];
  char number[24];
  int n = 0;
  for (long v = pid; v > 0 || n == 0; v /= 10) number[n++] = static_cast<char>('0' + v % 10);
  size_t at = 0;
  for (const char* p = kStackDumpBegin; *p != '\0'; ++p) line[at++] = *p;
  for (const char* p = ", pid "; *p != '\0'; ++p) line[at++] = *p;
  while (n > 0) line[at++] = number[--n];
  line[at++] = '\n';
  WriteAll(line, at);
  void* frames[64];
  const int depth = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, depth, STDERR_FILENO);
  const size_t len = collective_log::Format(line, sizeof(line));
  WriteAll(line, len);
  WriteText(kStackDumpEnd);
  WriteText("\n");
  errno = saved_errno;
}

}  // namespace

void InstallStackDumpHandler() {
  main_tid = static_cast<pid_t>(::syscall(SYS_gettid));
  void* warm[1];
  ::backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  struct sigaction action {};
  action.sa_handler = OnSigusr1;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &action, nullptr);
}

}  // namespace loom::train
