// Helpers of the tests that run ranks as child processes and time their deaths
// (comm_failure_test.cc, nccl_comm_test.cc).
#ifndef LOOM_TESTS_TRAIN_CHILD_PROCESS_H_
#define LOOM_TESTS_TRAIN_CHILD_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/child_signals.h"
#include "tests/train/test_util.h"

namespace loom::train::testing {

using Clock = std::chrono::steady_clock;

inline double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Starts `argv` as a child with stdout and stderr in `out_prefix`.out / .err; returns its pid.
// The child starts with an empty signal mask and every signal at its default action, whatever
// the test process inherited (tests/support/child_signals.h).
inline pid_t Spawn(const std::vector<std::string>& argv, const std::string& out_prefix,
                   const std::map<std::string, std::string>& env = {}) {
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::loom::testing::ResetSignalsForExec();
  for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
  int fd_out = ::open((out_prefix + ".out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int fd_err = ::open((out_prefix + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd_out < 0 || fd_err < 0) ::_exit(127);
  ::dup2(fd_out, 1);
  ::dup2(fd_err, 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  ::_exit(127);
}

struct Exit {
  int status = 0;
  Clock::time_point when;
  bool exited = false;  // false: still running at the deadline (then killed)
};

// Waits for every pid until `deadline_s` from now, polling, so each exit time is known to ~10 ms.
// Whatever is still running at the deadline is SIGKILLed and reported as not exited.
inline std::vector<Exit> WaitAll(const std::vector<pid_t>& pids, double deadline_s) {
  std::vector<Exit> exits(pids.size());
  const Clock::time_point start = Clock::now();
  size_t left = pids.size();
  while (left > 0 && Since(start) < deadline_s) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (exits[i].exited) continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        exits[i] = Exit{status, Clock::now(), true};
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (exits[i].exited) continue;
    ::kill(pids[i], SIGKILL);
    ::waitpid(pids[i], &exits[i].status, 0);
    exits[i].when = Clock::now();
  }
  return exits;
}

// Polls `path` until it contains `text`; false after `deadline_s`.
inline bool WaitForText(const std::string& path, const std::string& text, double deadline_s) {
  const Clock::time_point start = Clock::now();
  while (Since(start) < deadline_s) {
    if (ReadText(path).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

inline bool ExitedWith(const Exit& e, int code) {
  return e.exited && WIFEXITED(e.status) && WEXITSTATUS(e.status) == code;
}

}  // namespace loom::train::testing

#endif  // LOOM_TESTS_TRAIN_CHILD_PROCESS_H_
