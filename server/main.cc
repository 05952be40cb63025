// loomd: the Loom coordinator. Flags, signals and the ready file; everything else is
// LoomdServer (server/rpc/loomd_server.h).
//
//   loomd --state-dir=DIR [--listen=HOST:PORT] [--metrics-listen=HOST:PORT]
//         [--ready-file=PATH] [--advertise=HOST:PORT]
//         [--heartbeat-interval-ms=1000] [--node-timeout-ms=10000] [--start-fresh]
//         (--tls-cert=PEM --tls-key=PEM [--tls-client-ca=PEM] [--tokens-file=FILE] | --insecure)
//         [--data-roots=DIR[,DIR]] [--checkpoint-roots=DIR[,DIR]]
//         [--progress-timeout-floor-ms=300000] [--progress-timeout-factor=20]
//         [--startup-allowance-ms=900000] [--start-timeout-ms=300000]
//         [--drain-requeue-delay-ms=10000]
//         [--max-gpus-per-node=64] [--max-cpu-devices-per-node=1024]
//         [--max-streams-per-client=10000]
//
// Exit status: 0 after a graceful stop (SIGTERM/SIGINT), 2 for bad flags, 1 when it cannot
// start (state dir unusable, port taken).
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <iostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/ready_file.h"
#include "common/spec_path.h"
#include "server/jobs/default_spec_validator.h"
#include "server/rpc/loomd_server.h"

int main(int argc, char** argv) {
  // Abseil's lock-order graph, on in Debian's build of the library, records every acquisition
  // of gRPC's and Loom's mutexes: about 5 % of loomd's CPU in a storm of submits. The unit tests
  // keep it (they run the managers in-process, where a lock-order cycle is reported).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  CLI::App app{"loomd: the Loom coordinator (jobs, nodes, rendezvous, /metrics)"};
  loom::rpc::LoomdConfig config;
  std::string ready_file;
  int64_t heartbeat_ms = 1000;
  int64_t node_timeout_ms = 10000;
  std::string data_roots;
  std::string checkpoint_roots;
  int64_t progress_floor_ms = 300'000;
  int64_t startup_allowance_ms = 900'000;
  int64_t start_timeout_ms = 300'000;
  int64_t drain_requeue_delay_ms = 10'000;
  app.add_option("--listen", config.listen, "gRPC address HOST:PORT (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--metrics-listen", config.metrics_listen,
                 "Prometheus /metrics address HOST:PORT, IPv4 (port 0: any free port; empty: none)")
      ->capture_default_str();
  app.add_option("--state-dir", config.state_dir,
                 "Directory for the SQLite database (loomd.db, WAL) and job logs")
      ->required();
  app.add_option("--ready-file", ready_file,
                 "Write {\"grpc\",\"metrics\",\"pid\"} here once both servers are bound");
  app.add_option("--advertise", config.advertise,
                 "HOST:PORT that ranks use to reach the rendezvous service "
                 "(default: the bound --listen address)");
  app.add_option("--heartbeat-interval-ms", heartbeat_ms,
                 "How often workers must heartbeat (sent to them at registration)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{3'600'000}));
  app.add_option("--node-timeout-ms", node_timeout_ms,
                 "A node silent this long is LOST and its jobs fail over")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{86'400'000}));
  app.add_option("--tls-cert", config.tls.cert,
                 "PEM certificate (chain) of loomd's gRPC port; re-read when it changes");
  app.add_option("--tls-key", config.tls.key, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", config.tls.ca,
                 "PEM CA bundle that verifies client certificates (mutual TLS: workers as "
                 "node:NODE_ID, people as user:TENANT or admin:TENANT)");
  app.add_option("--tokens-file", config.tokens_file,
                 "Bearer tokens, one `ROLE SUBJECT TOKEN` per line (roles user, admin, node; "
                 "mode 600); re-read when it changes");
  app.add_flag("--insecure", config.insecure,
               "Plaintext gRPC, for loopback development only; without --tokens-file every "
               "caller is admin");
  app.add_option("--data-roots", data_roots,
                 "Comma-separated directories that spec.data.path and val_path must lie under "
                 "(default: any absolute path; workers check their own --data-roots too)");
  app.add_option("--checkpoint-roots", checkpoint_roots,
                 "Comma-separated directories, shared by every node, that spec.checkpoint.dir "
                 "must lie under (default: any absolute path)");
  app.add_flag("--start-fresh", config.start_fresh,
               "Start although loomd.db is missing or empty while the state dir shows it held "
               "jobs (the jobs are forgotten; gangs still running are quarantined, not killed)");
  app.add_option("--progress-timeout-floor-ms", progress_floor_ms,
                 "A running job with no step or checkpoint for max(this, factor x median step) "
                 "is hung: stacks dumped, gang restarted (0: watchdog off)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{86'400'000}));
  app.add_option("--progress-timeout-factor", config.progress_timeout_factor,
                 "The hang timeout in median step times (see --progress-timeout-floor-ms)")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1e6));
  app.add_option("--startup-allowance-ms", startup_allowance_ms,
                 "How long a started job may take to its first step before it counts as hung")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{86'400'000}));
  app.add_option("--start-timeout-ms", start_timeout_ms,
                 "A scheduled job whose ranks have not all started after this is re-placed on "
                 "other nodes (0: off)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{86'400'000}));
  app.add_option("--drain-requeue-delay-ms", drain_requeue_delay_ms,
                 "A job moved off a draining node is placed again after this (its ranks get the "
                 "worker's stop grace to checkpoint and exit first)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{3'600'000}));
  app.add_option("--max-gpus-per-node", config.device_limits.max_gpus,
                 "RegisterNode refuses a node with more GPUs")
      ->capture_default_str()
      ->check(CLI::Range(1, 1'000'000));
  app.add_option("--max-cpu-devices-per-node", config.device_limits.max_cpu_devices,
                 "RegisterNode refuses a node with more CPU devices")
      ->capture_default_str()
      ->check(CLI::Range(1, 1'000'000));
  app.add_option("--max-streams-per-client", config.max_streams_per_client,
                 "Open WatchJob/StreamJobLogs streams one caller may hold; more are refused "
                 "with RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::Range(1, 10'000'000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports through exceptions; they never leave main.
    return app.exit(e) == 0 ? 0 : 2;
  }
  config.heartbeat_interval = absl::Milliseconds(heartbeat_ms);
  config.node_timeout = absl::Milliseconds(node_timeout_ms);
  loom::jobs::SpecPolicy policy;
  for (auto [flag, value, out] :
       {std::tuple{"--data-roots", &data_roots, &policy.data_roots},
        std::tuple{"--checkpoint-roots", &checkpoint_roots, &policy.checkpoint_roots}}) {
    absl::StatusOr<std::vector<std::string>> roots = loom::ParseRoots(*value, flag);
    if (!roots.ok()) {
      std::cerr << "loomd: " << roots.status().message() << "\n";
      return 2;
    }
    *out = *std::move(roots);
  }
  config.progress_timeout_floor = absl::Milliseconds(progress_floor_ms);
  config.startup_allowance = absl::Milliseconds(startup_allowance_ms);
  config.start_timeout = absl::Milliseconds(start_timeout_ms);
  config.drain_requeue_delay = absl::Milliseconds(drain_requeue_delay_ms);

  // Block the stop signals in every thread (threads inherit the mask), so that only
  // sigwait() below sees them and shutdown runs on the main thread, not in a handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  loom::SystemClock clock;
  absl::StatusOr<std::unique_ptr<loom::rpc::LoomdServer>> server = loom::rpc::LoomdServer::Start(
      config, &clock, loom::jobs::MakeSpecValidator(std::move(policy)));
  if (!server.ok()) {
    LOOM_LOG(ERROR) << "loomd cannot start: " << server.status();
    return absl::IsInvalidArgument(server.status()) ? 2 : 1;
  }
  if (!ready_file.empty()) {
    absl::Status status =
        loom::WriteReadyFile(ready_file, {{"grpc", (*server)->grpc_address()},
                                          {"metrics", (*server)->metrics_address()},
                                          {"pid", absl::StrCat(getpid())}});
    if (!status.ok()) {
      LOOM_LOG(ERROR) << "--ready-file: " << status;
      (*server)->Shutdown();
      return 1;
    }
  }
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  LOOM_LOG(INFO) << "signal " << signal_number << " received; shutting down";
  (*server)->Shutdown();
  return 0;
}
