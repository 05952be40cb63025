#include "tests/integration/cluster.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "tests/support/child_signals.h"

#ifndef LOOM_TEST_BIN_DIR
#define LOOM_TEST_BIN_DIR ""
#endif

namespace loom::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

std::string ExeDir() {
  std::error_code ec;
  return std::filesystem::read_symlink("/proc/self/exe", ec).parent_path().string();
}

// The parent pid and state of `pid` from /proc, or false when it does not exist.
bool ProcStat(pid_t pid, pid_t* ppid, char* state) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos) return false;
  std::istringstream rest(line.substr(paren + 2));
  long parent = 0;
  rest >> *state >> parent;
  *ppid = static_cast<pid_t>(parent);
  return true;
}

std::vector<pid_t> AllPids() {
  std::vector<pid_t> pids;
  DIR* d = opendir("/proc");
  if (d == nullptr) return pids;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0') pids.push_back(static_cast<pid_t>(pid));
  }
  closedir(d);
  return pids;
}

// Kills every process whose parent is this process (rank processes orphaned by a killed worker
// are re-parented here because the test process is a child subreaper) and reaps them.
void KillOrphans() {
  for (int round = 0; round < 100; ++round) {
    bool found = false;
    for (pid_t pid : AllPids()) {
      pid_t ppid = 0;
      char state = '?';
      if (ProcStat(pid, &ppid, &state) && ppid == getpid()) {
        found = true;
        if (state != 'Z') kill(pid, SIGKILL);
      }
    }
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    if (!found) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Kills test_rank processes named in out_dir's .started files that still run (for ranks that
// escaped the subreaper, e.g. after a double fork).
void KillListedRanks(const std::string& out_dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(out_dir, ec)) {
    if (entry.path().extension() != ".started") continue;
    const nlohmann::json j = nlohmann::json::parse(ReadFile(entry.path().string()), nullptr, false);
    if (!j.is_object() || !j.contains("pid")) continue;
    const pid_t pid = j["pid"].get<pid_t>();
    if (ProcessAlive(pid) &&
        ReadFile("/proc/" + std::to_string(pid) + "/cmdline").find("test_rank") !=
            std::string::npos) {
      kill(pid, SIGKILL);
    }
  }
}

std::vector<char*> CArgv(std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (std::string& a : argv) out.push_back(a.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

bool WaitFor(const std::function<bool()>& predicate, absl::Duration timeout, absl::Duration poll) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (predicate()) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(poll);
  }
}

bool ProcessAlive(pid_t pid) {
  pid_t ppid = 0;
  char state = '?';
  if (pid <= 0 || !ProcStat(pid, &ppid, &state)) return false;
  return state != 'Z' && state != 'X';
}

// ---------------------------------------------------------------------------------------------
// Process

absl::StatusOr<std::unique_ptr<Process>> Process::Start(const std::vector<std::string>& argv,
                                                        const std::string& log_path) {
  std::vector<std::string> args = argv;
  std::vector<char*> cargv = CArgv(args);
  const std::string log = log_path;
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec (the test process has threads).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    setpgid(0, 0);
    // Daemons start as from an ordinary shell, whatever signals the test process inherited
    // ignored or blocked (a loomd deaf to Stop()'s SIGTERM would fail tests for no reason).
    testing::ResetSignalsForExec();
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  const std::string name = std::filesystem::path(argv[0]).filename().string();
  return std::unique_ptr<Process>(new Process(pid, name, log_path));
}

Process::~Process() { Kill(); }

void Process::Signal(int sig) const {
  if (!wait_status_.has_value()) kill(pid_, sig);
}

bool Process::Running() {
  if (wait_status_.has_value()) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    wait_status_ = status;
    return false;
  }
  if (r < 0 && errno == ECHILD) {  // reaped elsewhere
    wait_status_ = -1;
    return false;
  }
  return true;
}

std::optional<int> Process::Wait(absl::Duration timeout) {
  if (WaitFor([&] { return !Running(); }, timeout, absl::Milliseconds(10))) return wait_status_;
  return std::nullopt;
}

void Process::Stop(absl::Duration grace) {
  if (!Running()) return;
  kill(pid_, SIGCONT);  // a stopped process cannot act on SIGTERM
  kill(pid_, SIGTERM);
  if (!Wait(grace).has_value()) Kill();
}

void Process::Kill() {
  if (!Running()) return;
  kill(pid_, SIGKILL);
  int status = 0;
  if (waitpid(pid_, &status, 0) == pid_) {
    wait_status_ = status;
  } else {
    wait_status_ = -1;
  }
}

std::string Process::LogTail(size_t max_bytes) const {
  const std::string log = ReadFile(log_path_);
  return log.size() <= max_bytes ? log : "..." + log.substr(log.size() - max_bytes);
}

// ---------------------------------------------------------------------------------------------
// RunCommand

std::string CommandResult::Describe() const {
  return absl::StrCat("exit code ", exit_code, "\n--- stdout ---\n", out, "--- stderr ---\n", err);
}

CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout) {
  CommandResult result;
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return result;
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return result;
  }
  std::vector<std::string> args = argv;
  std::vector<char*> cargv = CArgv(args);
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    testing::ResetSignalsForExec();
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (pid < 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    result.err = absl::StrCat("fork: ", std::strerror(errno));
    return result;
  }
  const absl::Time deadline = absl::Now() + timeout;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  bool timed_out = false;
  while (open_fds > 0) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) {
      timed_out = true;
      break;
    }
    if (poll(fds, 2, static_cast<int>(std::min<int64_t>(left_ms, 1000))) < 0 && errno != EINTR) {
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buf[4096];
      const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  if (timed_out) kill(pid, SIGKILL);
  for (const pollfd& p : fds) {
    if (p.fd >= 0) close(p.fd);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = (!timed_out && WIFEXITED(status)) ? WEXITSTATUS(status) : -1;
  if (timed_out)
    absl::StrAppend(&result.err, "\n[killed after ", absl::FormatDuration(timeout), "]");
  return result;
}

// ---------------------------------------------------------------------------------------------
// Cluster

Cluster::Cluster(ClusterOptions options) : options_(options) {
  // Rank processes whose worker is killed are re-parented to us, so Shutdown() can end them.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  const char* env_bin = std::getenv("LOOM_TEST_BIN_DIR");
  bin_dir_ = (env_bin != nullptr && env_bin[0] != '\0') ? env_bin : LOOM_TEST_BIN_DIR;
  test_rank_path_ = options_.rank_program.empty() ? ExeDir() + "/test_rank"
                                                  : bin_dir_ + "/" + options_.rank_program;
}

Cluster::~Cluster() { Shutdown(); }

absl::Status Cluster::Start() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "loom-it-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", tmpl, ": ", std::strerror(errno)));
  }
  dir_ = tmpl;
  std::filesystem::create_directories(out_dir());
  if (!options_.rank_user.empty() && options_.rank_user != "root") {
    // Ranks of another user must reach their work dirs and write their .started files.
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all |
                                           std::filesystem::perms::group_exec |
                                           std::filesystem::perms::others_exec);
    std::filesystem::permissions(out_dir(), std::filesystem::perms::all);
  }
  std::vector<std::string> needed = {bin_dir_ + "/loomd", bin_dir_ + "/loomctl"};
  if (options_.workers > 0) {
    needed.push_back(bin_dir_ + "/loom-worker");
    needed.push_back(test_rank_path_);
  }
  for (const std::string& bin : needed) {
    if (access(bin.c_str(), X_OK) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(bin, " is missing; build the targets loomd, loom-worker, loomctl and ",
                       "the rank program (or set LOOM_TEST_BIN_DIR)"));
    }
  }
  if (options_.secure) {
    const std::string cmd = absl::StrCat("bash ", LOOM_SOURCE_DIR, "/scripts/dev-certs.sh ",
                                         certs_dir(), " >", dir_, "/dev-certs.log 2>&1");
    if (std::system(cmd.c_str()) != 0) {
      return absl::InternalError(absl::StrCat(cmd, " failed: ", ReadFile(dir_ + "/dev-certs.log")));
    }
    user_token_ = ReadFile(certs_dir() + "/user.token");
    while (!user_token_.empty() && std::isspace(static_cast<unsigned char>(user_token_.back()))) {
      user_token_.pop_back();
    }
  }
  if (absl::Status s = StartLoomd(0); !s.ok()) return s;
  for (int i = 0; i < options_.workers; ++i) {
    if (absl::Status s = StartWorker(i); !s.ok()) return s;
  }
  return WaitForNodes(options_.workers, loom::v1::NODE_STATE_READY, absl::Seconds(20));
}

absl::Status Cluster::WaitForReadyFile(Process& process, const std::string& path,
                                       std::string* grpc_address) {
  const bool ready = WaitFor(
      [&] {
        if (!process.Running()) return true;
        const nlohmann::json j = nlohmann::json::parse(ReadFile(path), nullptr, false);
        if (!j.is_object() || !j.contains("grpc") || !j["grpc"].is_string()) return false;
        *grpc_address = j["grpc"].get<std::string>();
        return true;
      },
      absl::Seconds(20));
  if (!process.Running()) {
    return absl::InternalError(
        absl::StrCat(process.name(), " exited before it was ready:\n", process.LogTail()));
  }
  if (!ready) {
    return absl::DeadlineExceededError(absl::StrCat(process.name(), " wrote no ready file ", path,
                                                    " within 20 s:\n", process.LogTail()));
  }
  return absl::OkStatus();
}

absl::Status Cluster::StartLoomd(int port) {
  const std::string n = std::to_string(++loomd_starts_);
  const std::string ready = absl::StrCat(dir_, "/loomd-", n, ".ready");
  std::vector<std::string> argv = {
      bin_dir_ + "/loomd",
      absl::StrCat("--listen=127.0.0.1:", port),
      "--metrics-listen=127.0.0.1:0",
      absl::StrCat("--state-dir=", dir_, "/state"),
      absl::StrCat("--ready-file=", ready),
      absl::StrCat("--heartbeat-interval-ms=", options_.heartbeat_interval_ms),
      absl::StrCat("--node-timeout-ms=", options_.node_timeout_ms)};
  if (options_.secure) {
    for (std::string flag : {"--tls-cert=loomd.pem", "--tls-key=loomd.key",
                             "--tls-client-ca=ca.pem", "--tokens-file=tokens"}) {
      const size_t eq = flag.find('=') + 1;
      argv.push_back(flag.substr(0, eq) + certs_dir() + "/" + flag.substr(eq));
    }
  } else {
    argv.push_back("--insecure");
  }
  argv.insert(argv.end(), options_.loomd_flags.begin(), options_.loomd_flags.end());
  auto process = Process::Start(argv, absl::StrCat(dir_, "/loomd-", n, ".log"));
  if (!process.ok()) return process.status();
  loomd_ = *std::move(process);
  std::string address;
  if (absl::Status s = WaitForReadyFile(*loomd_, ready, &address); !s.ok()) return s;
  const size_t colon = address.rfind(':');
  loomd_address_ = address;
  loomd_port_ = colon == std::string::npos ? 0 : std::atoi(address.c_str() + colon + 1);
  if (loomd_port_ <= 0) {
    return absl::InternalError(
        absl::StrCat("loomd's ready file ", ready, " has grpc='", address, "', not host:port"));
  }
  Connect();
  return absl::OkStatus();
}

void Cluster::Connect() {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (options_.secure) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadFile(certs_dir() + "/ca.pem");
    creds = grpc::SslCredentials(ssl);
  }
  channel_ = grpc::CreateChannel(loomd_address_, creds);
  jobs_ = loom::v1::JobService::NewStub(channel_);
  nodes_ = loom::v1::NodeService::NewStub(channel_);
}

absl::Status Cluster::StartWorker(int index) {
  const std::string name = absl::StrCat("worker-", index);
  const std::string ready = absl::StrCat(dir_, "/", name, ".ready");
  std::filesystem::remove(ready);
  std::vector<std::string> argv = {
      bin_dir_ + "/loom-worker",
      absl::StrCat("--coordinator=", options_.worker_coordinator.empty()
                                         ? loomd_address_
                                         : options_.worker_coordinator),
      "--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0", absl::StrCat("--name=", name),
      absl::StrCat("--cpu-devices=", options_.cpu_devices_per_worker),
      absl::StrCat("--work-dir=", dir_, "/work-", index), absl::StrCat("--ready-file=", ready),
      absl::StrCat("--rank-program=", test_rank_path_),
      // Data files and shared checkpoint dirs of the tests live in the cluster's temp dir.
      absl::StrCat("--data-roots=", dir_), absl::StrCat("--checkpoint-roots=", dir_),
      absl::StrCat("--stop-grace-ms=", options_.stop_grace_ms),
      absl::StrCat("--measure-devices=", options_.measure_devices ? "true" : "false")};
  const std::string rank_user =
      !options_.rank_user.empty() ? options_.rank_user : (geteuid() == 0 ? "root" : "");
  if (!rank_user.empty()) argv.push_back(absl::StrCat("--rank-user=", rank_user));
  if (options_.secure) {
    argv.push_back("--tls-ca=" + certs_dir() + "/ca.pem");
    argv.push_back("--join-token-file=" + certs_dir() + "/node.token");
  }
  argv.insert(argv.end(), options_.worker_flags.begin(), options_.worker_flags.end());
  auto process = Process::Start(argv, absl::StrCat(dir_, "/", name, ".log"));
  if (!process.ok()) return process.status();
  if (static_cast<int>(workers_.size()) <= index) {
    workers_.resize(index + 1);
    worker_addresses_.resize(index + 1);
  }
  workers_[index] = *std::move(process);
  return WaitForReadyFile(*workers_[index], ready, &worker_addresses_[index]);
}

absl::Status Cluster::WaitForNodes(int count, loom::v1::NodeState state, absl::Duration timeout) {
  std::string last;
  const bool ok = WaitFor(
      [&] {
        auto nodes = ListNodes();
        if (!nodes.ok()) {
          last = nodes.status().ToString();
          return false;
        }
        int n = 0;
        std::vector<std::string> seen;
        for (const auto& node : *nodes) {
          seen.push_back(absl::StrCat(node.name(), "=", loom::v1::NodeState_Name(node.state())));
          if (node.state() == state) ++n;
        }
        last = absl::StrJoin(seen, ", ");
        return n == count;
      },
      timeout, absl::Milliseconds(50));
  if (ok) return absl::OkStatus();
  return absl::DeadlineExceededError(
      absl::StrCat("expected ", count, " nodes ", loom::v1::NodeState_Name(state), " within ",
                   absl::FormatDuration(timeout), "; last seen: ", last, "\n", LogTails()));
}

void Cluster::Shutdown(bool keep_dir) {
  if (shut_down_ || dir_.empty()) return;
  shut_down_ = true;
  for (auto& w : workers_) {
    if (w) w->Stop(absl::Seconds(5));
  }
  // Close this process's connection first: loomd's graceful stop waits for open ones.
  jobs_.reset();
  nodes_.reset();
  channel_.reset();
  if (loomd_) loomd_->Stop(absl::Seconds(5));
  KillOrphans();
  KillListedRanks(out_dir());
  if (keep_dir) {
    std::cerr << "[cluster] kept " << dir_ << " for inspection" << std::endl;
  } else {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::vector<std::string> Cluster::LoomctlConnectionArgs() const {
  std::vector<std::string> args = {"--server", loomd_address_};
  if (options_.secure) {
    args.push_back("--tls-ca=" + certs_dir() + "/ca.pem");
    args.push_back("--token-file=" + certs_dir() + "/user.token");
  }
  return args;
}

CommandResult Cluster::Loomctl(const std::vector<std::string>& args, absl::Duration timeout) {
  std::vector<std::string> argv = {bin_dir_ + "/loomctl"};
  for (std::string& a : LoomctlConnectionArgs()) argv.push_back(std::move(a));
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, timeout);
}

std::string Cluster::WriteFile(const std::string& name, const std::string& content) {
  const std::string path = dir_ + "/" + name;
  std::ofstream(path) << content;
  return path;
}

absl::StatusOr<loom::v1::Job> Cluster::GetJob(const std::string& name) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!user_token_.empty()) context.AddMetadata("authorization", "Bearer " + user_token_);
  loom::v1::GetJobRequest request;
  request.set_name(name);
  loom::v1::Job job;
  const absl::Status s = FromGrpcStatus(jobs_->GetJob(&context, request, &job));
  if (!s.ok()) return s;
  return job;
}

absl::StatusOr<std::vector<loom::v1::Node>> Cluster::ListNodes() {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!user_token_.empty()) context.AddMetadata("authorization", "Bearer " + user_token_);
  loom::v1::ListNodesResponse response;
  const absl::Status s =
      FromGrpcStatus(nodes_->ListNodes(&context, loom::v1::ListNodesRequest(), &response));
  if (!s.ok()) return s;
  return std::vector<loom::v1::Node>(response.nodes().begin(), response.nodes().end());
}

absl::StatusOr<loom::v1::Job> Cluster::WaitForJob(
    const std::string& name, const std::function<bool(const loom::v1::Job&)>& done,
    absl::Duration timeout) {
  absl::StatusOr<loom::v1::Job> last = absl::UnknownError("never polled");
  if (WaitFor(
          [&] {
            last = GetJob(name);
            return last.ok() && done(*last);
          },
          timeout, absl::Milliseconds(50))) {
    return last;
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "waited ", absl::FormatDuration(timeout), " for ", name, "; last: ",
      last.ok() ? absl::StrCat(loom::v1::JobState_Name(last->state()), " (", last->state_reason(),
                               ") generation ", last->generation())
                : last.status().ToString()));
}

std::string Cluster::LogTails() const {
  std::string out;
  if (loomd_) absl::StrAppend(&out, "=== loomd log tail ===\n", loomd_->LogTail(), "\n");
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i]) {
      absl::StrAppend(&out, "=== worker-", i, " log tail ===\n", workers_[i]->LogTail(), "\n");
    }
  }
  return out;
}

}  // namespace loom::testing
