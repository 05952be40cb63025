#include "worker/agent/device_measurement.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace loom::worker {
namespace {

constexpr size_t kMaxOutput = 64 * 1024;

// An advisory lock on one file per host, held while measuring; released on close. Failing to
// take it only costs accuracy, so it is not an error.
class HostMeasureLock {
 public:
  HostMeasureLock() {
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::temp_directory_path(ec);
    if (ec) return;
    fd_ = ::open((dir / "loom-device-measure.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd_ >= 0) ::flock(fd_, LOCK_EX);
  }
  ~HostMeasureLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  HostMeasureLock(const HostMeasureLock&) = delete;
  HostMeasureLock& operator=(const HostMeasureLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace

absl::StatusOr<v1::DevicePeaks> ParseDevicePeaks(std::string_view line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  if (line.find("\"device_peaks\"") == std::string_view::npos) {
    return absl::InvalidArgumentError(
        "the measurement printed no {\"event\":\"device_peaks\", ...} line");
  }
  v1::DevicePeaks peaks;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // "event", "device"
  if (auto st = google::protobuf::util::JsonStringToMessage(std::string(line), &peaks, options);
      !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the measurement's line is not device_peaks JSON: ", st.message().ToString()));
  }
  if (peaks.gemm().empty()) {
    return absl::InvalidArgumentError("the measurement has no gemm sample");
  }
  if (peaks.gemm_size() > 16 || peaks.blocks_size() > 16) {
    return absl::InvalidArgumentError("the measurement has more than 16 samples of a kind");
  }
  return peaks;
}

absl::StatusOr<v1::DevicePeaks> MeasureCpuDevices(const std::string& program,
                                                  const std::map<std::string, std::string>& env,
                                                  const RankIdentity& identity,
                                                  absl::Duration timeout) {
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string arg0 = program, arg1 = "--measure-device";
  char* argv[] = {arg0.data(), arg1.data(), nullptr};

  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  HostMeasureLock lock;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out[0]);
    ::close(out[1]);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec.
    const int null = ::open("/dev/null", O_RDWR);
    if (null >= 0) {
      ::dup2(null, 0);
      ::dup2(null, 2);
    }
    ::dup2(out[1], 1);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    // Never more privilege than a rank gets. Groups first: after setuid they cannot change.
    if (identity.switch_user && (::setgroups(identity.groups.size(), identity.groups.data()) != 0 ||
                                 ::setgid(identity.gid) != 0 || ::setuid(identity.uid) != 0)) {
      ::_exit(126);
    }
    ::execve(program.c_str(), argv, envp.data());
    ::_exit(127);
  }
  ::close(out[1]);
  std::string output;
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(timeout);
  bool timed_out = false;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (output.size() < kMaxOutput) {
      output.append(buf, std::min<size_t>(n, kMaxOutput - output.size()));
    }
  }
  ::close(out[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(program, " --measure-device took longer than ",
                                                    absl::FormatDuration(timeout)));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat(program, " --measure-device failed (",
                                            WIFEXITED(status)
                                                ? absl::StrCat("exit ", WEXITSTATUS(status))
                                                : absl::StrCat("signal ", WTERMSIG(status)),
                                            ")"));
  }
  // The last non-empty line.
  while (!output.empty() && output.back() == '\n') output.pop_back();
  const size_t nl = output.rfind('\n');
  return ParseDevicePeaks(nl == std::string::npos ? output : output.substr(nl + 1));
}

absl::StatusOr<v1::DevicePeaks> MeasureCpuDevicesMedian(
    const std::string& program, const std::map<std::string, std::string>& env,
    const RankIdentity& identity, absl::Duration timeout, int runs) {
  std::vector<v1::DevicePeaks> ok;
  absl::Status last;
  for (int i = 0; i < runs; ++i) {
    absl::StatusOr<v1::DevicePeaks> p = MeasureCpuDevices(program, env, identity, timeout);
    if (p.ok()) {
      ok.push_back(*std::move(p));
    } else {
      last = p.status();
    }
  }
  if (ok.empty()) return last;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  v1::DevicePeaks out = ok.front();
  double total = 0;
  for (const v1::DevicePeaks& p : ok) total += p.measure_seconds();
  out.set_measure_seconds(total);
  std::vector<double> opt;
  for (const v1::DevicePeaks& p : ok) opt.push_back(p.optimizer_bytes_per_second());
  out.set_optimizer_bytes_per_second(median(opt));
  // Samples are matched by position and shape; a run with other shapes is left out of a sample.
  for (int i = 0; i < out.gemm_size(); ++i) {
    std::vector<double> v;
    for (const v1::DevicePeaks& p : ok) {
      if (i < p.gemm_size() && p.gemm(i).rows() == out.gemm(i).rows() &&
          p.gemm(i).inner() == out.gemm(i).inner() && p.gemm(i).cols() == out.gemm(i).cols()) {
        v.push_back(p.gemm(i).flops_per_second());
      }
    }
    out.mutable_gemm(i)->set_flops_per_second(median(v));
  }
  for (int i = 0; i < out.blocks_size(); ++i) {
    std::vector<double> v;
    for (const v1::DevicePeaks& p : ok) {
      if (i < p.blocks_size() && p.blocks(i).hidden() == out.blocks(i).hidden() &&
          p.blocks(i).seq_len() == out.blocks(i).seq_len() &&
          p.blocks(i).micro_batch() == out.blocks(i).micro_batch()) {
        v.push_back(p.blocks(i).seconds());
      }
    }
    out.mutable_blocks(i)->set_seconds(median(v));
  }
  return out;
}

}  // namespace loom::worker
