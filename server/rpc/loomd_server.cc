#include "server/rpc/loomd_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "proto/register_descriptors.h"
#include "server/rpc/rpc_metrics_interceptor.h"
#include "server/store/state_dir_guard.h"

namespace loom::rpc {
namespace {

// Bounds on the synchronous server's waiting threads (see their use in LoomdServer::Start).
constexpr int kSyncMinPollers = 4;
constexpr int kSyncMaxPollers = 64;

absl::Status CheckConfig(const LoomdConfig& config) {
  if (config.state_dir.empty()) {
    return absl::InvalidArgumentError(
        "--state-dir is required: the directory for loomd.db and job logs");
  }
  if (absl::StatusOr<HostPort> hp = ParseHostPort(config.listen); !hp.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--listen: ", hp.status().message()));
  }
  if (!config.metrics_listen.empty()) {
    if (absl::StatusOr<HostPort> hp = ParseHostPort(config.metrics_listen); !hp.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--metrics-listen: ", hp.status().message()));
    }
  }
  if (!config.advertise.empty()) {
    absl::StatusOr<HostPort> hp = ParseHostPort(config.advertise);
    if (!hp.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--advertise: ", hp.status().message()));
    }
    if (hp->port == 0) {
      return absl::InvalidArgumentError(
          "--advertise needs a real port (ranks connect to it), e.g. 10.0.0.5:7070");
    }
  }
  if (config.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--heartbeat-interval-ms must be > 0");
  }
  if (config.node_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--node-timeout-ms must be > 0");
  }
  if (!config.tls.cert.empty() && config.tokens_file.empty() && config.tls.ca.empty()) {
    return absl::InvalidArgumentError(
        "TLS without a way to authenticate callers: give --tokens-file (bearer tokens) and/or "
        "--tls-client-ca (client certificates)");
  }
  if (config.progress_timeout_floor < absl::ZeroDuration() ||
      config.startup_allowance < absl::ZeroDuration() ||
      config.start_timeout < absl::ZeroDuration() ||
      config.drain_requeue_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--progress-timeout-floor-ms, --startup-allowance-ms, --start-timeout-ms and "
        "--drain-requeue-delay-ms must be >= 0 (0 turns that watchdog off)");
  }
  if (!(config.progress_timeout_factor >= 1)) {
    return absl::InvalidArgumentError("--progress-timeout-factor must be >= 1, e.g. 20");
  }
  if (config.max_streams_per_client < 1) {
    return absl::InvalidArgumentError("--max-streams-per-client must be >= 1, e.g. 10000");
  }
  if (config.device_limits.max_gpus < 1 || config.device_limits.max_cpu_devices < 1) {
    return absl::InvalidArgumentError(
        "--max-gpus-per-node and --max-cpu-devices-per-node must be >= 1");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<LoomdServer>> LoomdServer::Start(const LoomdConfig& config,
                                                                const Clock* clock,
                                                                jobs::SpecValidator validator) {
  RETURN_IF_ERROR(CheckConfig(config));
  std::error_code ec;
  std::filesystem::create_directories(config.state_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir: cannot create \"", config.state_dir, "\": ", ec.message()));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   MakeServerCredentials(config.tls, config.insecure, config.listen, "--tls"));
  std::unique_ptr<LoomdServer> s(new LoomdServer());
  const bool open = config.insecure && config.tokens_file.empty();
  ASSIGN_OR_RETURN(s->authenticator_, auth::Authenticator::Create(config.tokens_file, open, clock));
  if (open) {
    LOOM_LOG(WARNING) << "no authentication (--insecure without --tokens-file): every caller on "
                         "this loopback address is admin of tenant \"default\"";
  }
  ASSIGN_OR_RETURN(s->rendezvous_secrets_, auth::RendezvousSecrets::Open(
                                               absl::StrCat(config.state_dir, "/rendezvous.key")));
  s->registry_ = std::make_unique<metrics::Registry>();
  s->server_metrics_ = std::make_unique<server_metrics::ServerMetrics>(s->registry_.get());
  const std::string db_path = absl::StrCat(config.state_dir, "/loomd.db");
  ASSIGN_OR_RETURN(const store::StateDirVerdict verdict,
                   store::CheckStateDir(config.state_dir, db_path, config.start_fresh));
  if (verdict.fresh_over_history) {
    LOOM_LOG(WARNING) << "--start-fresh: " << verdict.finding
                      << "; starting with an empty database, unknown running gangs will be "
                         "quarantined (see loomctl nodes list)";
  }
  ASSIGN_OR_RETURN(s->store_, store::OpenSqliteJobStore(db_path));
  {
    // A database that holds jobs marks the directory, so that losing it later is noticed.
    ASSIGN_OR_RETURN(const store::JobPage first, s->store_->ListJobs(std::nullopt, 0, 1));
    if (!first.jobs.empty()) RETURN_IF_ERROR(store::MarkStateDirHeldJobs(config.state_dir));
  }
  // After the job store, which creates and checks the file.
  ASSIGN_OR_RETURN(s->calibration_store_, calibration::OpenSqliteCalibrationStore(db_path));
  ASSIGN_OR_RETURN(s->calibrator_,
                   calibration::Calibrator::Create(s->calibration_store_.get(), clock));
  ASSIGN_OR_RETURN(s->scale_test_store_, scaling::OpenSqliteScaleTestStore(db_path));
  ASSIGN_OR_RETURN(s->logs_, jobs::LogStore::Open(absl::StrCat(config.state_dir, "/logs")));
  LoomdServer* self = s.get();
  // The checker runs only for RPCs, which start after manager_ is set below.
  s->rendezvous_ = std::make_unique<rendezvous::RendezvousStore>(
      [self](std::string_view job, int64_t generation) {
        return self->manager_->CheckRendezvousScope(job, generation);
      });

  jobs::JobManagerOptions options;
  options.heartbeat_interval = config.heartbeat_interval;
  options.node_timeout = config.node_timeout;
  options.progress_timeout_floor = config.progress_timeout_floor;
  options.progress_timeout_factor = config.progress_timeout_factor;
  options.startup_allowance = config.startup_allowance;
  options.start_timeout = config.start_timeout;
  options.drain_requeue_delay = config.drain_requeue_delay;
  options.device_limits = config.device_limits;
  options.quarantine_unknown_gangs = verdict.fresh_over_history;
  options.on_first_job = [state_dir = config.state_dir] {
    if (absl::Status status = store::MarkStateDirHeldJobs(state_dir); !status.ok()) {
      LOOM_LOG(ERROR) << "cannot mark the state dir as holding jobs: " << status;
    }
  };
  // Empty until the port is bound (when --advertise is not given); nothing is scheduled
  // before SetRendezvousAddress below.
  options.rendezvous_address = config.advertise;
  const auth::RendezvousSecrets* secrets = s->rendezvous_secrets_.get();
  options.rendezvous_secret = [secrets](const std::string& job, int64_t generation) {
    return secrets->SecretFor(job, generation);
  };
  ASSIGN_OR_RETURN(s->manager_, jobs::JobManager::Create(
                                    s->store_.get(), clock, std::move(validator), s->logs_.get(),
                                    s->rendezvous_.get(), s->server_metrics_.get(), options,
                                    s->calibrator_.get()));
  jobs::JobManager* manager = s->manager_.get();
  s->server_metrics_->SetSnapshotSource([manager] { return manager->MetricsSnapshot(); });
  s->job_service_ = std::make_unique<JobServiceImpl>(
      manager, s->logs_.get(), s->authenticator_.get(), config.max_streams_per_client);
  s->node_service_ = std::make_unique<NodeServiceImpl>(manager, s->authenticator_.get());
  s->rendezvous_service_ = std::make_unique<RendezvousServiceImpl>(s->rendezvous_.get(), secrets);
  ASSIGN_OR_RETURN(s->scale_tests_,
                   scaling::ScaleTestManager::Create(s->scale_test_store_.get(), manager, clock,
                                                     s->server_metrics_.get()));
  s->scaling_service_ =
      std::make_unique<ScalingServiceImpl>(s->scale_tests_.get(), s->authenticator_.get());

  grpc::EnableDefaultHealthCheckService(true);
  // Reflection looks types up by name: every file in the pool first (proto/register_descriptors.h).
  RegisterProtoDescriptors();
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.listen, credentials, &port);
  builder.SetMaxReceiveMessageSize(config.max_receive_message_bytes);
  // The unary methods run on gRPC's synchronous server, whose thread manager keeps between
  // MIN_POLLERS and MAX_POLLERS threads waiting for calls. Its defaults (1 and 2) make a thread
  // that finished a call exit whenever two others are already waiting, and a new one start when
  // a call leaves fewer than one waiting: under 32 concurrent CLI submits that was 644 thread
  // creations and exits per 1,024 CreateJobs (each a clone, a stack mapped and unmapped, a
  // malloc arena given back). With these bounds the storm created 31 threads and ended none,
  // and loomd's CPU per submit fell about 6 % (docs/benchmarks.md, 2026-12-07). Idle threads beyond
  // the bound still exit, so a burst never leaves more than kSyncMaxPollers behind (the streams run
  // on the callback API and use none).
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, kSyncMinPollers);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, kSyncMaxPollers);
  builder.RegisterService(s->job_service_.get());
  builder.RegisterService(s->node_service_.get());
  builder.RegisterService(s->rendezvous_service_.get());
  builder.RegisterService(s->scaling_service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(NewRpcMetricsInterceptorFactory(
      s->server_metrics_.get(), clock,
      {v1::JobService::service_full_name(), v1::NodeService::service_full_name(),
       v1::RendezvousService::service_full_name(), v1::ScalingService::service_full_name()}));
  builder.experimental().SetInterceptorCreators(std::move(creators));
  s->grpc_server_ = builder.BuildAndStart();
  if (s->grpc_server_ == nullptr || port == 0) {
    s->manager_->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("--listen: cannot listen on ", config.listen,
                     " (address in use or not local?); pick another address or port 0"));
  }
  const HostPort listen = *ParseHostPort(config.listen);
  s->grpc_address_ = FormatHostPort(listen.host, port);
  s->advertise_ = config.advertise.empty() ? s->grpc_address_ : config.advertise;
  if (config.advertise.empty() && (listen.host == "0.0.0.0" || listen.host == "::")) {
    LOOM_LOG(WARNING) << "ranks on other nodes cannot reach the wildcard address " << s->advertise_
                      << "; set --advertise=HOST:PORT";
  }
  manager->SetRendezvousAddress(s->advertise_);

  if (!config.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<metrics::MetricsExposer>> exposer =
        metrics::MetricsExposer::Start(config.metrics_listen, s->registry_.get());
    if (!exposer.ok()) {
      s->Shutdown();
      return absl::Status(exposer.status().code(),
                          absl::StrCat("--metrics-listen: ", exposer.status().message()));
    }
    s->metrics_exposer_ = std::move(*exposer);
    s->metrics_address_ = s->metrics_exposer_->address();
  }
  manager->StartTicker(config.tick_interval);
  s->scale_tests_->StartTicker(std::max(config.tick_interval, absl::Milliseconds(200)));
  LOOM_LOG(INFO) << "loomd serving gRPC (" << (config.tls.cert.empty() ? "plaintext" : "TLS")
                 << ", " << (open ? "no authentication" : "tokens/certificates") << ") on "
                 << s->grpc_address_ << ", metrics on "
                 << (s->metrics_address_.empty() ? "(none)" : s->metrics_address_)
                 << ", rendezvous address " << s->advertise_ << ", state in " << config.state_dir;
  return s;
}

LoomdServer::~LoomdServer() { Shutdown(); }

void LoomdServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  // Wake every long-lived call first so that the gRPC shutdown does not wait for them.
  if (scale_tests_) scale_tests_->Shutdown();
  if (manager_) manager_->Shutdown();
  if (rendezvous_) rendezvous_->Shutdown();
  if (logs_) logs_->Shutdown();
  if (grpc_server_) {
    // Unary calls take milliseconds and every stream was just ended, so a short grace is
    // enough; what is left after it (e.g. a peer that never acknowledges GOAWAY) is cancelled.
    grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    grpc_server_->Wait();
  }
  metrics_exposer_.reset();
  LOOM_LOG(INFO) << "loomd stopped";
}

}  // namespace loom::rpc
