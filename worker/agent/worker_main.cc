// loom-worker: the node agent. Flag parsing and wiring only; the parts live beside this file:
// gpu_inventory (devices), supervisor + launcher (rank processes), session_client + outbound_buffer
// (loomd), node_metrics (/metrics).
//
// Start-up: inventory -> own gRPC server (health, reflection) -> metrics server -> supervisor ->
// session. The ready file is written once the first RegisterNode succeeded. SIGTERM/SIGINT: every
// rank is stopped (SIGTERM, SIGKILL after --stop-grace-ms) after loomd is told the node drains
// (WorkerDraining: its gangs are re-queued without spending restarts), the exits are sent to loomd
// if it is reachable within a few seconds, and the worker exits 0. If the worker itself is
// SIGKILLed, the ranks die with it through PR_SET_PDEATHSIG; if it freezes, they stop themselves
// through the fence (--fence-timeout-ms, docs/rank-contract.md).
#include <fcntl.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/metrics_exposer.h"
#include "common/net.h"
#include "common/ready_file.h"
#include "common/spec_path.h"
#include "common/tls.h"
#include "proto/register_descriptors.h"
#include "worker/agent/device_measurement.h"
#include "worker/agent/gpu_inventory.h"
#include "worker/agent/node_identity.h"
#include "worker/agent/node_metrics.h"
#include "worker/agent/outbound_buffer.h"
#include "worker/agent/path_confinement.h"
#include "worker/agent/rank_environment.h"
#include "worker/agent/rank_user.h"
#include "worker/agent/session_client.h"
#include "worker/agent/supervisor.h"
#include "worker/agent/trace_responder.h"

extern char** environ;

namespace {

constexpr int kExitBadFlags = 2;
constexpr int kExitStartFailed = 1;
constexpr absl::Duration kShutdownFlush = absl::Seconds(3);

// The launcher dup2()s onto fds 0-2 in the child; make sure the worker's own are open so that no
// pipe is ever created there.
void EnsureStdFds() {
  for (int fd = 0; fd < 3; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0) ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
  }
}

// The cores this process (and so every rank it starts) may run on: its CPU affinity, which a
// container's cpuset or `taskset` narrows; the machine's count when that cannot be read.
int AffinityCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) {
    return CPU_COUNT(&set);
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace

int main(int argc, char** argv) {
  // Abseil's lock-order graph, on in Debian's build of the library, records every acquisition
  // of gRPC's and Loom's mutexes: about 5 % of loomd's CPU in a storm of submits. The unit tests
  // keep it (they run the managers in-process, where a lock-order cycle is reported).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  using namespace loom;
  using namespace loom::worker;
  EnsureStdFds();

  CLI::App app{"loom-worker: the Loom node agent (runs the ranks loomd assigns to this node)"};
  std::string coordinator, listen = "127.0.0.1:0", metrics_listen = "127.0.0.1:0", name;
  std::string work_dir, ready_file, rank_program, data_roots, checkpoint_roots, rank_user;
  int cpu_devices = -1;
  int64_t stop_grace_ms = 10000;
  TlsFiles tls;
  std::string join_token_file;
  bool insecure = false;
  int64_t fence_timeout_ms = 30000;
  bool measure_devices = true;
  app.add_option("--coordinator", coordinator, "loomd's address, HOST:PORT")->required();
  app.add_option("--listen", listen, "This worker's gRPC address (health, reflection)")
      ->capture_default_str();
  app.add_option("--metrics-listen", metrics_listen,
                 "Prometheus /metrics address HOST:PORT, IPv4 (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--name", name, "Node id [a-z0-9-] (default: the sanitised hostname)");
  app.add_option("--cpu-devices", cpu_devices,
                 "CPU devices to advertise (default: 1 without GPUs, 0 with GPUs)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--work-dir", work_dir, "Directory for job files (created if missing)")
      ->required();
  app.add_option("--ready-file", ready_file,
                 "Written with {grpc, metrics, pid} once registered and serving");
  app.add_option("--rank-program", rank_program,
                 "Program run per rank (default: loom-train beside loom-worker)");
  app.add_option("--stop-grace-ms", stop_grace_ms, "SIGTERM, then SIGKILL after this")
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}))
      ->capture_default_str();
  app.add_option("--tls-ca", tls.ca,
                 "PEM CA bundle that verifies loomd's certificate (TLS to loomd; handed to the "
                 "ranks as LOOM_TLS_CA for the rendezvous)");
  app.add_option("--tls-cert", tls.cert,
                 "PEM client certificate named node:NODE_ID (mutual TLS with loomd); also serves "
                 "this worker's own gRPC port");
  app.add_option("--tls-key", tls.key, "PEM private key of --tls-cert");
  app.add_option("--join-token-file", join_token_file,
                 "File (mode 600) with a node token from loomd's --tokens-file");
  app.add_flag("--insecure", insecure,
               "Plaintext to loomd even when it is not on loopback (development only)");
  app.add_option("--data-roots", data_roots,
                 "Comma-separated directories that spec.data.path and val_path must resolve "
                 "under, symbolic links followed (default: the work dir; / allows any)");
  app.add_option("--checkpoint-roots", checkpoint_roots,
                 "Comma-separated directories that spec.checkpoint.dir must resolve under "
                 "(default: the work dir; / allows any)");
  app.add_option("--rank-user", rank_user,
                 "User the ranks run as when the worker runs as root (default: nobody; root "
                 "is the explicit opt-out for development)");
  app.add_option("--fence-timeout-ms", fence_timeout_ms,
                 "A rank that hears nothing from this worker for this long (the worker is frozen "
                 "or gone) stops itself")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2000}, int64_t{86'400'000}));
  app.add_option("--measure-devices", measure_devices,
                 "Measure the CPU devices with the rank program when starting (three runs of "
                 "about a second) and register them with those figures, which loomd's planner uses "
                 "instead of its catalog")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitBadFlags;
  }

  // Check every flag before starting anything.
  absl::StatusOr<HostPort> coordinator_hp = ParseHostPort(coordinator);
  absl::StatusOr<HostPort> listen_hp = ParseHostPort(listen);
  if (!coordinator_hp.ok() || !listen_hp.ok() || !ParseHostPort(metrics_listen).ok()) {
    for (auto [flag, value] :
         {std::pair{"--coordinator", &coordinator}, std::pair{"--listen", &listen},
          std::pair{"--metrics-listen", &metrics_listen}}) {
      if (auto hp = ParseHostPort(*value); !hp.ok()) {
        std::cerr << "loom-worker: " << flag << ": " << hp.status().message() << "\n";
      }
    }
    return kExitBadFlags;
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> loomd_credentials =
      MakeChannelCredentials(tls, insecure, coordinator, "--tls");
  if (!loomd_credentials.ok()) {
    std::cerr << "loom-worker: " << loomd_credentials.status().message() << "\n";
    return kExitBadFlags;
  }
  std::string join_token;
  if (!join_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(join_token_file, "--join-token-file");
    if (!token.ok()) {
      std::cerr << "loom-worker: " << token.status().message() << "\n";
      return kExitBadFlags;
    }
    join_token = *std::move(token);
  }
  if (!tls.ca.empty()) tls.ca = std::filesystem::absolute(tls.ca).string();
  const std::string hostname = Hostname();
  if (name.empty()) name = SanitizeNodeId(hostname);
  if (!IsValidNodeId(name)) {
    std::cerr << "loom-worker: --name=" << name
              << ": a node id is 1..63 characters of [a-z0-9-], not starting or ending with '-'\n";
    return kExitBadFlags;
  }
  std::error_code ec;
  std::filesystem::create_directories(work_dir, ec);
  const std::filesystem::path work_path = std::filesystem::absolute(work_dir, ec);
  if (ec || !std::filesystem::is_directory(work_path)) {
    std::cerr << "loom-worker: --work-dir=" << work_dir << ": cannot create or use it"
              << (ec ? ": " + ec.message() : "") << "\n";
    return kExitBadFlags;
  }
  PathRoots roots;
  for (auto [flag, value, out] :
       {std::tuple{"--data-roots", &data_roots, &roots.data},
        std::tuple{"--checkpoint-roots", &checkpoint_roots, &roots.checkpoint}}) {
    absl::StatusOr<std::vector<std::string>> parsed =
        ParseRoots(value->empty() ? work_path.string() : *value, flag);
    if (!parsed.ok()) {
      std::cerr << "loom-worker: " << parsed.status().message() << "\n";
      return kExitBadFlags;
    }
    *out = *std::move(parsed);
  }
  absl::StatusOr<RankIdentity> rank_identity = ResolveRankUser(rank_user, ::geteuid());
  if (!rank_identity.ok()) {
    std::cerr << "loom-worker: " << rank_identity.status().message() << "\n";
    return kExitBadFlags;
  }
  if (rank_program.empty()) {
    absl::StatusOr<std::string> dir = ExecutableDir();
    if (!dir.ok()) {
      std::cerr << "loom-worker: --rank-program not given and " << dir.status().message() << "\n";
      return kExitBadFlags;
    }
    rank_program = *dir + "/loom-train";
  }
  rank_program = std::filesystem::absolute(rank_program, ec).string();
  if (::access(rank_program.c_str(), X_OK) != 0) {
    // Not fatal: the program may be installed later; launches fail PERMANENT until then.
    LOOM_LOG(WARNING) << "rank program " << rank_program << " is not executable (yet)";
  }

  // Block the stop signals in every thread (threads inherit the mask) so that main receives them
  // with sigtimedwait; the launcher clears the mask in each rank.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  std::vector<v1::Device> devices = DiscoverGpus();
  const size_t gpu_count = devices.size();
  if (cpu_devices < 0) cpu_devices = gpu_count == 0 ? 1 : 0;
  for (v1::Device& d : CpuDevices(cpu_devices)) devices.push_back(std::move(d));
  if (devices.empty()) {
    std::cerr << "loom-worker: this node has no GPU and --cpu-devices=0: nothing to offer\n";
    return kExitBadFlags;
  }

  // Own gRPC server: health and reflection, for operators and probes.
  grpc::EnableDefaultHealthCheckService(true);
  // Reflection looks types up by name: every file in the pool first (proto/register_descriptors.h).
  loom::RegisterProtoDescriptors();
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  // It serves health and reflection only; with --tls-cert it serves them over TLS.
  std::shared_ptr<grpc::ServerCredentials> own_credentials = grpc::InsecureServerCredentials();
  if (!tls.cert.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> c =
        MakeServerCredentials({tls.cert, tls.key, ""}, false, listen, "--tls");
    if (!c.ok()) {
      LOOM_LOG(ERROR) << c.status().message();
      return kExitBadFlags;
    }
    own_credentials = *c;
  }
  builder.AddListeningPort(listen, own_credentials, &grpc_port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || grpc_port == 0) {
    LOOM_LOG(ERROR) << "cannot listen on --listen=" << listen;
    return kExitStartFailed;
  }
  const std::string grpc_address = FormatHostPort(listen_hp->host, grpc_port);

  metrics::Registry registry;
  absl::StatusOr<std::unique_ptr<metrics::MetricsExposer>> metrics_server =
      metrics::MetricsExposer::Start(metrics_listen, &registry);
  if (!metrics_server.ok()) {
    LOOM_LOG(ERROR) << "--metrics-listen=" << metrics_listen << ": "
                    << metrics_server.status().message();
    return kExitStartFailed;
  }
  const std::string metrics_address = (*metrics_server)->address();

  OutboundBuffer buffer;
  SupervisorOptions sup;
  sup.work_dir = work_path.string();
  sup.rank_program = rank_program;
  sup.stop_grace = absl::Milliseconds(stop_grace_ms);
  sup.fence_timeout = absl::Milliseconds(fence_timeout_ms);
  sup.devices = devices;
  sup.roots = roots;
  sup.rank_user = *rank_identity;
  std::vector<std::string> environ_entries;
  for (char** e = environ; *e != nullptr; ++e) environ_entries.emplace_back(*e);
  sup.inherited_env = InheritedEnvironment(environ_entries, DefaultInheritedEnvironment());
  // gcc's OpenMP spins while waiting by default; with one rank per CPU device sharing a node
  // that makes the CPU kernels many times slower (docs/benchmarks.md). A job's `env` or the
  // worker's own environment can still choose otherwise.
  sup.inherited_env.emplace("OMP_WAIT_POLICY", "passive");
  // Ranks verify loomd's rendezvous port with the CA the worker trusts.
  if (!tls.ca.empty()) sup.inherited_env["LOOM_TLS_CA"] = tls.ca;
  // The node's cores are shared among its CPU devices, so N ranks never run N times as many
  // threads as cores; the device measurement below computes with the same share.
  const int cores = AffinityCores();
  sup.cpu_threads_per_device = CpuThreadsPerDevice(cores, cpu_devices);
  std::map<std::string, std::string> supervisor_env(sup.inherited_env.begin(),
                                                    sup.inherited_env.end());
  if (cpu_devices > 0) {
    DefaultCpuThreads(sup.cpu_threads_per_device, &supervisor_env);
    LOOM_LOG(INFO) << cpu_devices << " CPU device(s) on " << cores << " core(s): each CPU rank "
                   << "computes with OMP_NUM_THREADS=" << supervisor_env["OMP_NUM_THREADS"]
                   << " and OPENBLAS_NUM_THREADS=" << supervisor_env["OPENBLAS_NUM_THREADS"]
                   << " unless its job's env says otherwise";
    if (cpu_devices > cores) {
      LOOM_LOG(WARNING) << "--cpu-devices=" << cpu_devices << " is more than the " << cores
                        << " cores this worker runs on: the CPU ranks of a job that uses them "
                           "all time-share the cores, so its step times measure the node, not "
                           "the layout (use --cpu-devices="
                        << cores << " or fewer for timings)";
    }
  }
  Supervisor supervisor(std::move(sup), &buffer);
  if (absl::Status st = supervisor.Start(); !st.ok()) {
    LOOM_LOG(ERROR) << st.message();
    return kExitStartFailed;
  }

  SessionOptions session_options;
  session_options.coordinator = coordinator;
  session_options.credentials = *loomd_credentials;
  session_options.bearer_token = join_token;
  v1::RegisterNodeRequest& reg = session_options.registration;
  reg.set_node_id(name);
  reg.set_hostname(hostname);
  std::optional<v1::DevicePeaks> peaks;
  if (measure_devices && cpu_devices > 0) {
    absl::StatusOr<v1::DevicePeaks> measured =
        MeasureCpuDevicesMedian(rank_program, supervisor_env, *rank_identity, absl::Seconds(60));
    if (measured.ok()) {
      peaks = *std::move(measured);
      LOOM_LOG(INFO) << "measured the CPU devices in " << peaks->measure_seconds() << " s";
    } else {
      LOOM_LOG(WARNING) << "CPU devices not measured (the planner uses its catalog): "
                        << measured.status().message();
    }
  }
  for (const v1::Device& d : devices) {
    v1::Device* added = reg.add_devices();
    *added = d;
    if (peaks.has_value() && d.kind() == v1::DEVICE_KIND_CPU) *added->mutable_peaks() = *peaks;
  }
  reg.set_cpu_cores(cores);
  reg.set_address(grpc_address);
  reg.set_metrics_address(metrics_address);
  SessionCallbacks callbacks;
  callbacks.running_jobs = [&supervisor] { return supervisor.RunningJobs(); };
  callbacks.on_assign = [&supervisor](v1::Assignment a) { supervisor.Assign(std::move(a)); };
  callbacks.on_cancel = [&supervisor](const v1::CancelAssignment& c) {
    supervisor.Cancel(c.job(), c.generation(), c.reason(), c.checkpoint());
  };
  callbacks.on_dump_stacks = [&supervisor](const v1::DumpStacks& d) {
    supervisor.DumpStacks(d.job(), d.generation());
  };
  // Timelines (`loomctl trace`): the ranks' trace rings read on loomd's request.
  TraceResponder traces({.work_dir = work_path.string()},
                        [&buffer](v1::WorkerMessage m) { buffer.Push(std::move(m)); });
  callbacks.on_trace_request = [&traces](const v1::TraceRequest& r) { traces.Request(r); };
  SessionClient session(std::move(session_options), &buffer, std::move(callbacks));
  NodeMetrics node_metrics(
      &registry, devices,
      {[&supervisor] { return supervisor.stats(); }, [&session] { return session.connected(); }});
  session.Start();
  LOOM_LOG(INFO) << "loom-worker nodes/" << name << ": " << gpu_count << " GPU(s), " << cpu_devices
                 << " CPU device(s); grpc " << grpc_address << ", metrics " << metrics_address
                 << ", work dir " << work_path.string() << ", rank program " << rank_program
                 << ", ranks run as " << rank_identity->name << ", coordinator " << coordinator;

  bool ready_written = false;
  int received = 0;
  for (;;) {
    const timespec tick{0, 100 * 1000 * 1000};
    siginfo_t info{};
    received = sigtimedwait(&stop_signals, &info, &tick);
    if (received > 0) break;
    if (!ready_written && session.registrations() > 0) {
      ready_written = true;
      if (!ready_file.empty()) {
        absl::Status st = WriteReadyFile(ready_file, {{"grpc", grpc_address},
                                                      {"metrics", metrics_address},
                                                      {"pid", absl::StrCat(::getpid())}});
        if (!st.ok()) LOOM_LOG(ERROR) << "ready file: " << st.message();
      }
    }
  }
  LOOM_LOG(INFO) << "received " << (received == SIGINT ? "SIGINT" : "SIGTERM")
                 << "; draining: stopping every rank";
  // loomd first: no new work here, and our gangs go back to its queue without spending a
  // restart (queued before the ranks' exits, which it then ignores as stale).
  {
    v1::WorkerMessage draining;
    draining.mutable_draining()->set_reason(
        absl::StrCat("stopping on ", received == SIGINT ? "SIGINT" : "SIGTERM"));
    buffer.Push(std::move(draining));
  }
  supervisor.Shutdown();
  session.Stop(kShutdownFlush);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  metrics_server->reset();
  LOOM_LOG(INFO) << "loom-worker stopped";
  return 0;
}
