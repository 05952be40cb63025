// A real Loom cluster for integration tests: loomd and N loom-worker processes on loopback,
// every port chosen by the kernel (port 0) and learned from the daemons' ready files, every
// state and work directory under one temp dir. Processes are started with fork/exec and are
// killed (SIGKILL) if the test process dies; Shutdown() — also run by the destructor, so a
// failing test cleans up too — stops the daemons, then kills every rank process that outlived
// its worker (the test process is made a child subreaper, so orphans land here).
//
// Binaries: loomd, loom-worker and loomctl from the build's bin/ directory (the compile-time
// LOOM_TEST_BIN_DIR, overridable by the environment variable of the same name); test_rank from
// the directory of the running test binary.
#pragma once

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "loom/v1/job.grpc.pb.h"
#include "loom/v1/node.grpc.pb.h"

namespace loom::testing {

// Polls `predicate` every `poll` until it holds (true) or `timeout` passes (false).
bool WaitFor(const std::function<bool()>& predicate, absl::Duration timeout,
             absl::Duration poll = absl::Milliseconds(20));

// Whether `pid` names a running process (a zombie counts as gone).
bool ProcessAlive(pid_t pid);

// One child process; stdout and stderr are appended to a log file.
class Process {
 public:
  // argv[0] is a path. INTERNAL when fork fails; an exec failure shows as exit code 127.
  static absl::StatusOr<std::unique_ptr<Process>> Start(const std::vector<std::string>& argv,
                                                        const std::string& log_path);
  ~Process();  // Kill()
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  const std::string& name() const { return name_; }
  void Signal(int sig) const;
  // Reaps the child if it has exited; returns whether it still runs.
  bool Running();
  // Waits for the exit; the wait status, or nullopt after `timeout`.
  std::optional<int> Wait(absl::Duration timeout);
  // SIGTERM, then SIGKILL after `grace`.
  void Stop(absl::Duration grace);
  void Kill();
  // The last `max_bytes` of the log.
  std::string LogTail(size_t max_bytes = 4000) const;

 private:
  Process(pid_t pid, std::string name, std::string log_path)
      : pid_(pid), name_(std::move(name)), log_path_(std::move(log_path)) {}
  pid_t pid_;
  std::string name_;
  std::string log_path_;
  std::optional<int> wait_status_;
};

struct CommandResult {
  int exit_code = -1;  // -1: killed by a signal or by the timeout
  std::string out;
  std::string err;
  // For assertion messages: the exit code and both streams.
  std::string Describe() const;
};

// Runs `argv` to completion, capturing stdout and stderr; kills it after `timeout`.
CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout);

struct ClusterOptions {
  int workers = 2;
  int cpu_devices_per_worker = 2;
  int heartbeat_interval_ms = 200;
  int node_timeout_ms = 2000;
  int stop_grace_ms = 2000;
  // The workers' --rank-program: a binary name in the build's bin/ directory (e.g. "loom-train"),
  // or empty for test_rank next to the test binary.
  std::string rank_program;
  // TLS and tokens as in production (scripts/dev-certs.sh in the temp dir): loomd with
  // --tls-cert/--tls-key/--tokens-file, workers with --tls-ca/--join-token-file, this harness and
  // Loomctl() with the CA and the user token of tenant "dev". false: loomd --insecure.
  bool secure = true;
  // The workers' --rank-user. Empty: "root" when the tests run as root (the explicit opt-out, so
  // that ranks can write the test's private temp dir), nothing otherwise (ranks run as the
  // tests' user). Another user makes the temp dir and its out/ folder reachable by that user.
  std::string rank_user;
  // Extra loomd flags, e.g. {"--progress-timeout-floor-ms=2000"}.
  std::vector<std::string> loomd_flags;
  // Extra loom-worker flags, e.g. {"--fence-timeout-ms=2000"}.
  std::vector<std::string> worker_flags;
  // The workers' --measure-devices: off by default so that a cluster starts in milliseconds
  // (the measurement takes three runs of about a second of both cores per worker, serialized
  // per host).
  bool measure_devices = false;
  // The address the workers dial for loomd (e.g. a proxy that can drop their connections);
  // empty: loomd's own address.
  std::string worker_coordinator;
};

class Cluster {
 public:
  explicit Cluster(ClusterOptions options = {});
  ~Cluster();

  // Creates the temp dir, starts loomd and the workers, and waits until every node is READY.
  absl::Status Start();
  // Starts loomd on `port` (0: any), on the cluster's state dir, and waits for its ready file.
  absl::Status StartLoomd(int port = 0);
  absl::Status StartWorker(int index);
  // Waits until ListNodes shows `count` nodes in `state`.
  absl::Status WaitForNodes(int count, loom::v1::NodeState state, absl::Duration timeout);
  // Stops everything (see the file comment). Idempotent. Keeps the temp dir when `keep_dir`.
  void Shutdown(bool keep_dir = false);

  Process& loomd() { return *loomd_; }
  Process& worker(int index) { return *workers_.at(index); }
  const std::string& loomd_address() const { return loomd_address_; }
  // The gRPC address from a worker's ready file.
  const std::string& worker_address(int index) const { return worker_addresses_.at(index); }
  int loomd_port() const { return loomd_port_; }
  const std::string& dir() const { return dir_; }
  // Where test_rank writes its files (pass it as LOOM_TEST_OUT_DIR in the job's env).
  std::string out_dir() const { return dir_ + "/out"; }
  const std::string& test_rank_path() const { return test_rank_path_; }
  std::string loomctl_path() const { return bin_dir_ + "/loomctl"; }

  loom::v1::JobService::Stub& jobs() { return *jobs_; }
  loom::v1::NodeService::Stub& nodes() { return *nodes_; }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }

  // The certificates and tokens directory (secure clusters), and the arguments loomctl needs to
  // reach loomd (--server, and --tls-ca/--token-file when secure).
  std::string certs_dir() const { return dir_ + "/certs"; }
  std::vector<std::string> LoomctlConnectionArgs() const;
  // Runs loomctl against this cluster's loomd (the connection arguments are added).
  CommandResult Loomctl(const std::vector<std::string>& args,
                        absl::Duration timeout = absl::Seconds(60));
  // Writes `content` to dir()/name and returns its path.
  std::string WriteFile(const std::string& name, const std::string& content);

  absl::StatusOr<loom::v1::Job> GetJob(const std::string& name);
  absl::StatusOr<std::vector<loom::v1::Node>> ListNodes();
  // Polls GetJob until `done(job)` holds; DEADLINE_EXCEEDED (with the last state) otherwise.
  absl::StatusOr<loom::v1::Job> WaitForJob(const std::string& name,
                                           const std::function<bool(const loom::v1::Job&)>& done,
                                           absl::Duration timeout);

  // The tails of every daemon log, for failure messages.
  std::string LogTails() const;

 private:
  absl::Status WaitForReadyFile(Process& process, const std::string& path,
                                std::string* grpc_address);
  void Connect();

  ClusterOptions options_;
  std::string dir_;
  std::string bin_dir_;
  std::string test_rank_path_;
  int loomd_starts_ = 0;
  std::unique_ptr<Process> loomd_;
  std::vector<std::unique_ptr<Process>> workers_;
  std::vector<std::string> worker_addresses_;
  std::string loomd_address_;
  int loomd_port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::string user_token_;  // secure clusters: sent with every call of this harness
  std::unique_ptr<loom::v1::JobService::Stub> jobs_;
  std::unique_ptr<loom::v1::NodeService::Stub> nodes_;
  bool shut_down_ = false;
};

}  // namespace loom::testing
