// LoomdServer: loomd assembled. It opens the state directory (SQLite store in WAL mode with the
// planner's calibration tables, job logs), builds the managers, and serves JobService,
// NodeService, RendezvousService and ScalingService on one gRPC port (with grpc.health.v1 and
// server reflection) and /metrics on an HTTP port. main.cc adds flags and signals; the rpc tests
// start it in process on port 0.
//
// Threading: Start() and Shutdown() from one thread; the accessors are thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/metrics_exposer.h"
#include "common/tls.h"
#include "server/auth/authenticator.h"
#include "server/auth/rendezvous_secrets.h"
#include "server/calibration/calibration_store.h"
#include "server/calibration/calibrator.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/log_store.h"
#include "server/metrics/server_metrics.h"
#include "server/rendezvous/rendezvous_store.h"
#include "server/rpc/job_service.h"
#include "server/rpc/node_service.h"
#include "server/rpc/rendezvous_service.h"
#include "server/rpc/scaling_service.h"
#include "server/scaling/scale_test_manager.h"
#include "server/scaling/scale_test_store.h"
#include "server/store/job_store.h"

namespace loom::rpc {

struct LoomdConfig {
  std::string listen = "127.0.0.1:7070";          // gRPC; port 0 picks a free port
  std::string metrics_listen = "127.0.0.1:7071";  // /metrics; empty: no metrics endpoint
  std::string state_dir;                          // REQUIRED; created if missing
  std::string advertise;  // host:port given to ranks for rendezvous; empty: the bound listen
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration node_timeout = absl::Seconds(10);
  absl::Duration tick_interval = absl::Milliseconds(100);
  int max_receive_message_bytes = 4 << 20;  // larger requests get RESOURCE_EXHAUSTED
  // Open WatchJob + StreamJobLogs streams per caller (principal); more get RESOURCE_EXHAUSTED.
  int max_streams_per_client = 10'000;
  // Security (DESIGN.md, "Security"). TLS from --tls-cert/--tls-key, with --tls-client-ca for
  // client certificates (mutual TLS with workers); callers authenticate with a token from
  // --tokens-file or a certificate. `insecure` serves plaintext, on loopback only; without a
  // tokens file it also authenticates nobody (every caller is admin of tenant "default").
  TlsFiles tls;
  std::string tokens_file;
  bool insecure = false;
  // Start although loomd.db is lost (missing, empty, schema-less or jobless) while the state
  // dir shows it held jobs (server/store/state_dir_guard.h); unknown gangs are then quarantined.
  bool start_fresh = false;
  // Watchdogs, drain and device limits (see JobManagerOptions for each).
  absl::Duration progress_timeout_floor = absl::Minutes(5);
  double progress_timeout_factor = 20;
  absl::Duration startup_allowance = absl::Minutes(15);
  absl::Duration start_timeout = absl::Minutes(5);
  absl::Duration drain_requeue_delay = absl::Seconds(10);
  nodes::DeviceLimits device_limits;
};

class LoomdServer {
 public:
  // Validates `config` (INVALID_ARGUMENT naming the flag), opens the state (FAILED_PRECONDITION
  // naming --start-fresh when the database was lost over a state dir that held jobs), binds
  // both ports (UNAVAILABLE when one cannot be bound) and starts serving. `clock` must outlive the
  // server.
  static absl::StatusOr<std::unique_ptr<LoomdServer>> Start(const LoomdConfig& config,
                                                            const Clock* clock,
                                                            jobs::SpecValidator validator);
  ~LoomdServer();
  LoomdServer(const LoomdServer&) = delete;
  LoomdServer& operator=(const LoomdServer&) = delete;

  // host:port actually bound (the real port when 0 was asked for).
  const std::string& grpc_address() const { return grpc_address_; }
  // Empty when no metrics server runs.
  const std::string& metrics_address() const { return metrics_address_; }
  const std::string& advertise_address() const { return advertise_; }
  jobs::JobManager* manager() { return manager_.get(); }
  scaling::ScaleTestManager* scale_tests() { return scale_tests_.get(); }
  metrics::Registry* registry() { return registry_.get(); }

  // Graceful stop: ends sessions, watches, log followers and rendezvous waits, lets in-flight
  // unary calls finish (up to 1 s), stops the metrics server. Idempotent.
  void Shutdown();

 private:
  LoomdServer() = default;

  std::unique_ptr<metrics::Registry> registry_;
  std::unique_ptr<server_metrics::ServerMetrics> server_metrics_;
  std::unique_ptr<store::JobStore> store_;
  std::unique_ptr<calibration::CalibrationStore> calibration_store_;
  std::unique_ptr<calibration::Calibrator> calibrator_;
  std::unique_ptr<jobs::LogStore> logs_;
  std::unique_ptr<rendezvous::RendezvousStore> rendezvous_;
  std::unique_ptr<auth::Authenticator> authenticator_;
  std::unique_ptr<auth::RendezvousSecrets> rendezvous_secrets_;
  std::unique_ptr<jobs::JobManager> manager_;
  std::unique_ptr<scaling::ScaleTestStore> scale_test_store_;
  std::unique_ptr<scaling::ScaleTestManager> scale_tests_;
  std::unique_ptr<ScalingServiceImpl> scaling_service_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<NodeServiceImpl> node_service_;
  std::unique_ptr<RendezvousServiceImpl> rendezvous_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<metrics::MetricsExposer> metrics_exposer_;
  std::string grpc_address_;
  std::string metrics_address_;
  std::string advertise_;
  bool shut_down_ = false;
};

}  // namespace loom::rpc
