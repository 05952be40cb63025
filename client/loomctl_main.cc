// loomctl: the command-line client of Loom. Flag parsing only; the commands live in
// client/commands.cc. Exit codes: client/exit_codes.h.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/time/time.h"
#include "client/commands.h"
#include "client/connection.h"
#include "client/exit_codes.h"
#include "client/output_format.h"
#include "client/scale_test_command.h"
#include "client/trace_command.h"
#include "common/tls.h"

namespace {

// Ends the process once a command is done: the output is flushed, and nothing else is left to
// do. Skipping the destructors skips gRPC's shutdown (joining its threads, tearing the channel
// down), which would otherwise add to every call of a short-lived CLI.
[[noreturn]] int Finish(int code) {
  std::cout.flush();
  std::cerr.flush();
  std::_Exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace loom::client;

  CLI::App app{"loomctl: submit, follow and inspect Loom training jobs"};
  app.require_subcommand(1);
  app.fallthrough(true);  // global flags are accepted after the command too

  std::string server;
  std::string output = "table";
  double timeout_seconds = 10;
  std::string token, token_file;
  loom::TlsFiles tls;
  bool insecure = false;
  app.add_option("--server", server,
                 "loomd address host:port (default: $LOOM_SERVER, else 127.0.0.1:7070)");
  app.add_option("-o,--output", output, "Output format: table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}));
  app.add_option("--timeout", timeout_seconds, "Deadline of each request, in seconds")
      ->check(CLI::PositiveNumber);
  app.add_option("--token-file", token_file,
                 "File (mode 600) with your bearer token (default: $LOOM_TOKEN_FILE, else the "
                 "token in $LOOM_TOKEN)");
  app.add_option("--token", token, "Bearer token (prefer --token-file: flags show in ps)");
  app.add_option("--tls-ca", tls.ca,
                 "PEM CA bundle that verifies loomd (default: $LOOM_TLS_CA; else loopback is "
                 "plaintext and other hosts use the system's roots)");
  app.add_option("--tls-cert", tls.cert, "PEM client certificate (user:TENANT or admin:TENANT)");
  app.add_option("--tls-key", tls.key, "PEM private key of --tls-cert");
  app.add_flag("--insecure", insecure, "Plaintext even to a host that is not loopback");

  SubmitArgs submit_args;
  CLI::App* submit = app.add_subcommand(
      "submit", "Submit a job from a YAML spec (or a sweep: -f once per spec, one connection)");
  submit
      ->add_option("-f,--file", submit_args.files,
                   "Job spec YAML ('-' for stdin); repeat for several jobs, submitted together")
      ->required();
  submit->add_flag("--wait", submit_args.wait,
                   "Follow the job to its end; exit 1 if it fails or is cancelled (one spec)");
  submit->add_option("--request-id", submit_args.request_id,
                     "Idempotency key (default: a fresh random id); with several specs the "
                     "i-th gets ID-i");

  PlanArgs plan_args;
  CLI::App* plan =
      app.add_subcommand("plan", "Rank parallel layouts for a job spec (offline with --cluster)");
  plan->add_option("-f,--file", plan_args.file, "Job spec YAML ('-' for stdin)")->required();
  plan->add_option("--cluster", plan_args.cluster,
                   "Cluster file (nodes, gpus_per_node, gpu, bandwidths): plan offline, "
                   "without a server");
  plan->add_option("--top", plan_args.top_k, "How many plans to show (default 5)")
      ->check(CLI::Range(1, 50));

  ScaleTestArgs scale_args;
  CLI::App* scale = app.add_subcommand(
      "scale-test", "Run short copies of a job at several sizes; efficiency and where it is lost");
  scale->add_option("-f,--file", scale_args.file, "Job spec YAML ('-' for stdin)")->required();
  scale->add_option("--devices", scale_args.devices, "Sizes, increasing, e.g. 1,2,4,8")->required();
  scale->add_flag("--weak", scale_args.weak,
                  "Weak scaling: the global batch grows with the devices (default: fixed)");
  scale->add_option("--steps", scale_args.steps, "Steps per size (default 20)")
      ->check(CLI::Range(4, 10000));
  scale->add_option("--plot", scale_args.plot, "Write the figure here (SVG)");
  scale->add_option("--request-id", scale_args.request_id,
                    "Idempotency key (default: a fresh random id)");

  std::string job;
  bool get_wait = false;
  CLI::App* get = app.add_subcommand("get", "Show one job, with its events");
  get->add_option("JOB", job, "abc or jobs/abc")->required();
  get->add_flag("--wait", get_wait,
                "Wait for the job to end; exit 1 if it failed or was cancelled");

  std::string state;
  CLI::App* list = app.add_subcommand("list", "List jobs, oldest first");
  list->add_option("--state", state, "Only jobs in this state (e.g. running)");

  CLI::App* watch = app.add_subcommand("watch", "Follow a job's progress to its end");
  watch->add_option("JOB", job, "abc or jobs/abc")->required();

  LogsArgs logs_args;
  std::optional<int> rank;
  CLI::App* logs = app.add_subcommand("logs", "Print a job's stdout/stderr, per rank");
  logs->add_option("JOB", logs_args.job, "abc or jobs/abc")->required();
  logs->add_flag("-f,--follow", logs_args.follow, "Keep printing new lines until the job ends");
  logs->add_option("--rank", rank, "Only this rank");

  CLI::App* doctor =
      app.add_subcommand("doctor", "Show what the doctor found in a running job, with fixes");
  doctor->add_option("JOB", job, "abc or jobs/abc")->required();

  TraceArgs trace_args;
  CLI::App* trace = app.add_subcommand(
      "trace", "Write every rank's phases of a running job as a Perfetto / Chrome trace");
  trace->add_option("JOB", trace_args.job, "abc or jobs/abc")->required();
  trace->add_option("--steps", trace_args.steps,
                    "Steps A:B (at most 64; default: the last 8 steps rank 0 reported)");
  trace
      ->add_option("--wait", trace_args.wait_seconds,
                   "Seconds to wait for the job to run past the last step (0: ask at once)")
      ->check(CLI::Range(0.0, 86400.0));
  trace->add_option("-o,--output", trace_args.file, "The file to write ('-' for stdout)")
      ->capture_default_str();

  CLI::App* cancel = app.add_subcommand("cancel", "Cancel a job (its ranks are stopped)");
  cancel->add_option("JOB", job, "abc or jobs/abc")->required();

  CLI::App* nodes = app.add_subcommand("nodes", "List the worker nodes (or drain/delete one)");
  nodes->require_subcommand(0, 1);
  CLI::App* nodes_list = nodes->add_subcommand("list", "List the worker nodes (the default)");
  DrainArgs drain_args;
  CLI::App* drain = nodes->add_subcommand(
      "drain", "Admin: place no new work on a node (its running jobs finish unless moved)");
  drain->add_option("NODE", drain_args.node, "gpu-1 or nodes/gpu-1")->required();
  drain->add_flag("--move-jobs", drain_args.move_jobs,
                  "Also stop its running jobs now; they are re-queued without spending restarts");
  drain->add_flag("--stop-quarantined", drain_args.stop_quarantined,
                  "Stop the unknown jobs quarantined there after loomd started fresh");
  drain->add_flag("--undo", drain_args.undo, "Undrain: the node takes new work again");
  std::string delete_node;
  bool delete_force = false;
  CLI::App* del =
      nodes->add_subcommand("delete", "Admin: remove a node so that its devices stop counting");
  del->add_option("NODE", delete_node, "gpu-1 or nodes/gpu-1")->required();
  del->add_flag("--force", delete_force,
                "Delete although it is READY or runs jobs (they are re-queued)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help or the error
    return rc == 0 ? kExitOk : kExitInvalidInput;
  }

  if (tls.ca.empty()) {
    if (const char* env = std::getenv("LOOM_TLS_CA"); env != nullptr) tls.ca = env;
  }
  const std::string address = ResolveServerAddress(server);
  absl::StatusOr<bool> plaintext = loom::ChannelIsPlaintext(tls, insecure, address, "--tls");
  absl::StatusOr<std::string> bearer = ResolveToken(token, token_file);
  for (const absl::Status& s : {plaintext.status(), bearer.status()}) {
    if (!s.ok()) {
      std::cerr << "loomctl: " << s.message() << "\n";
      return kExitInvalidInput;
    }
  }
  const absl::Duration rpc_timeout =
      absl::Milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  // The unary calls of scripts go on the wire without gRPC's runtime (client/wire_client.h):
  // plaintext, or TLS against a --tls-ca; unless LOOM_CLIENT_TRANSPORT=grpc asks for gRPC's.
  // TLS against the system's roots: everything through gRPC.
  std::unique_ptr<Connection> connection;
  const char* transport = std::getenv("LOOM_CLIENT_TRANSPORT");
  const bool grpc_only = transport != nullptr && std::string_view(transport) == "grpc";
  if (*plaintext) {
    connection = std::make_unique<Connection>(
        address, rpc_timeout, *bearer, grpc_only ? UnaryTransport::kGrpc : UnaryTransport::kWire);
  } else if (!tls.ca.empty() && !grpc_only) {
    // TLS against the given CA: the unary calls on the wire too; gRPC's credentials (the same
    // files, checked above) only if a stream or another call needs the channel.
    connection = std::make_unique<Connection>(
        address, rpc_timeout, *bearer, WireTls{tls.ca, tls.cert, tls.key},
        [tls, insecure, address] {
          absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
              loom::MakeChannelCredentials(tls, insecure, address, "--tls");
          if (!credentials.ok()) {  // the files changed since they were checked
            std::cerr << "loomctl: " << credentials.status().message() << "\n";
            std::exit(kExitInvalidInput);
          }
          return *credentials;
        });
  } else {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        loom::MakeChannelCredentials(tls, insecure, address, "--tls");
    if (!credentials.ok()) {
      std::cerr << "loomctl: " << credentials.status().message() << "\n";
      return kExitInvalidInput;
    }
    connection = std::make_unique<Connection>(address, rpc_timeout, *credentials, *bearer);
  }
  CommandContext ctx;
  ctx.connection = connection.get();
  ctx.format = *ParseOutputFormat(output);  // checked by CLI::IsMember above
  ctx.out = &std::cout;
  ctx.err = &std::cerr;
  ctx.out_is_tty = isatty(STDOUT_FILENO) == 1;
  ctx.err_is_tty = isatty(STDERR_FILENO) == 1;

  if (*submit) return Finish(RunSubmit(ctx, submit_args));
  if (*plan) return Finish(RunPlan(ctx, plan_args));
  if (*get) return Finish(RunGet(ctx, job, get_wait));
  if (*list) return Finish(RunList(ctx, state));
  if (*watch) return Finish(RunWatch(ctx, job));
  if (*logs) {
    logs_args.rank = rank;
    return Finish(RunLogs(ctx, logs_args));
  }
  if (*cancel) return Finish(RunCancel(ctx, job));
  if (*doctor) return Finish(RunDoctor(ctx, job));
  if (*scale) return Finish(RunScaleTest(ctx, scale_args));
  if (*trace) return Finish(RunTrace(ctx, trace_args));
  if (*drain) return Finish(RunDrainNode(ctx, drain_args));
  if (*del) return Finish(RunDeleteNode(ctx, delete_node, delete_force));
  if (*nodes || *nodes_list) return Finish(RunNodes(ctx));
  return kExitInvalidInput;
}
