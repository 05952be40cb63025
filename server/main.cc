// loomd: the Loom coordinator. Flags, signals and the ready file; everything else is
// LoomdServer (server/rpc/loomd_server.h).
//
//   loomd --state-dir=DIR [--listen=HOST:PORT] [--metrics-listen=HOST:PORT]
//         [--ready-file=PATH] [--advertise=HOST:PORT]
//         [--heartbeat-interval-ms=1000] [--node-timeout-ms=10000]
//         (--tls-cert=PEM --tls-key=PEM [--tls-client-ca=PEM] [--tokens-file=FILE] | --insecure)
//         [--data-roots=DIR[,DIR]] [--checkpoint-roots=DIR[,DIR]]
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
#include "common/clock.h"
#include "common/logging.h"
#include "common/ready_file.h"
#include "common/spec_path.h"
#include "server/jobs/default_spec_validator.h"
#include "server/rpc/loomd_server.h"

int main(int argc, char** argv) {
  CLI::App app{"loomd: the Loom coordinator (jobs, nodes, rendezvous, /metrics)"};
  loom::rpc::LoomdConfig config;
  std::string ready_file;
  int64_t heartbeat_ms = 1000;
  int64_t node_timeout_ms = 10000;
  std::string data_roots;
  std::string checkpoint_roots;
  app.add_option("--listen", config.listen, "gRPC address HOST:PORT (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--metrics-listen", config.metrics_listen,
                 "Prometheus /metrics address HOST:PORT (port 0: any free port)")
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
