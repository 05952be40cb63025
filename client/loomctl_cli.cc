#include "client/loomctl_cli.h"

#include <array>

#include "client/exit_codes.h"

namespace loom::client {
namespace {

// Global options that take a value as the next argument ("--server HOST:PORT").
constexpr std::array<std::string_view, 10> kValueOptions = {
    "--server", "-o",       "--output",   "--timeout", "--token-file",
    "--token",  "--tls-ca", "--tls-cert", "--tls-key", "--persist"};

constexpr std::array<std::string_view, 11> kSubcommands = {
    "submit", "plan",   "scale-test", "get",    "list", "watch",
    "logs",   "doctor", "trace",      "cancel", "nodes"};

void DefineGlobalFlags(LoomctlCli& c) {
  LoomctlFlags& f = c.flags;
  c.app.require_subcommand(1);
  c.app.fallthrough(true);  // global flags are accepted after the command too
  c.app.add_option("--server", f.server,
                   "loomd address host:port (default: $LOOM_SERVER, else 127.0.0.1:7070)");
  c.app.add_option("-o,--output", f.output, "Output format: table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}));
  c.app.add_option("--timeout", f.timeout_seconds, "Deadline of each request, in seconds")
      ->check(CLI::PositiveNumber);
  c.app.add_option("--token-file", f.token_file,
                   "File (mode 600) with your bearer token (default: $LOOM_TOKEN_FILE, else the "
                   "token in $LOOM_TOKEN)");
  c.app.add_option("--token", f.token, "Bearer token (prefer --token-file: flags show in ps)");
  c.app.add_option("--tls-ca", f.tls.ca,
                   "PEM CA bundle that verifies loomd (default: $LOOM_TLS_CA; else loopback is "
                   "plaintext and other hosts use the system's roots)");
  c.app.add_option("--tls-cert", f.tls.cert,
                   "PEM client certificate (user:TENANT or admin:TENANT)");
  c.app.add_option("--tls-key", f.tls.key, "PEM private key of --tls-cert");
  c.app.add_flag("--insecure", f.insecure, "Plaintext even to a host that is not loopback");
  c.app.add_option("--persist", f.persist,
                   "Keep a connection to loomd open for this long after the last call (e.g. "
                   "60s, 10m; 0: off), shared by later loomctl calls of yours: submit, get, list "
                   "and cancel (default: $LOOM_PERSIST, else over TLS a call within 2s of "
                   "another starts one kept 10s, and plaintext goes without)");
}

}  // namespace

std::unique_ptr<LoomctlCli> BuildLoomctlCli(std::string_view only) {
  auto cli = std::make_unique<LoomctlCli>();
  LoomctlCli& c = *cli;
  LoomctlFlags& f = c.flags;
  DefineGlobalFlags(c);
  // In the order `loomctl --help` lists them.
  const auto want = [only](std::string_view name) { return only.empty() || only == name; };

  if (want("submit")) {
    CLI::App* submit = c.submit = c.app.add_subcommand(
        "submit", "Submit a job from a YAML spec (or a sweep: -f once per spec, one connection)");
    submit
        ->add_option("-f,--file", f.submit.files,
                     "Job spec YAML ('-' for stdin); repeat for several jobs, submitted together")
        ->required();
    submit->add_flag("--wait", f.submit.wait,
                     "Follow the job to its end; exit 1 if it fails or is cancelled (one spec)");
    submit->add_option("--request-id", f.submit.request_id,
                       "Idempotency key (default: a fresh random id); with several specs the "
                       "i-th gets ID-i");
  }
  if (want("plan")) {
    CLI::App* plan = c.plan = c.app.add_subcommand(
        "plan", "Rank parallel layouts for a job spec (offline with --cluster)");
    plan->add_option("-f,--file", f.plan.file, "Job spec YAML ('-' for stdin)")->required();
    plan->add_option("--cluster", f.plan.cluster,
                     "Cluster file (nodes, gpus_per_node, gpu, bandwidths): plan offline, "
                     "without a server");
    plan->add_option("--top", f.plan.top_k, "How many plans to show (default 5)")
        ->check(CLI::Range(1, 50));
  }
  if (want("scale-test")) {
    CLI::App* scale = c.scale = c.app.add_subcommand(
        "scale-test",
        "Run short copies of a job at several sizes; efficiency and where it is lost");
    scale->add_option("-f,--file", f.scale.file, "Job spec YAML ('-' for stdin)")->required();
    scale->add_option("--devices", f.scale.devices, "Sizes, increasing, e.g. 1,2,4,8")->required();
    scale->add_flag("--weak", f.scale.weak,
                    "Weak scaling: the global batch grows with the devices (default: fixed)");
    scale->add_option("--steps", f.scale.steps, "Steps per size (default 20)")
        ->check(CLI::Range(4, 10000));
    scale->add_option("--plot", f.scale.plot, "Write the figure here (SVG)");
    scale->add_option("--request-id", f.scale.request_id,
                      "Idempotency key (default: a fresh random id)");
  }
  if (want("get")) {
    CLI::App* get = c.get = c.app.add_subcommand("get", "Show one job, with its events");
    get->add_option("JOB", f.job, "abc or jobs/abc")->required();
    get->add_flag("--wait", f.get_wait,
                  "Wait for the job to end; exit 1 if it failed or was cancelled");
  }
  if (want("list")) {
    c.list = c.app.add_subcommand("list", "List jobs, oldest first");
    c.list->add_option("--state", f.state, "Only jobs in this state (e.g. running)");
  }
  if (want("watch")) {
    c.watch = c.app.add_subcommand("watch", "Follow a job's progress to its end");
    c.watch->add_option("JOB", f.job, "abc or jobs/abc")->required();
  }
  if (want("logs")) {
    CLI::App* logs = c.logs = c.app.add_subcommand("logs", "Print a job's stdout/stderr, per rank");
    logs->add_option("JOB", f.logs.job, "abc or jobs/abc")->required();
    logs->add_flag("-f,--follow", f.logs.follow, "Keep printing new lines until the job ends");
    logs->add_option("--rank", f.rank, "Only this rank");
  }
  if (want("doctor")) {
    c.doctor =
        c.app.add_subcommand("doctor", "Show what the doctor found in a running job, with fixes");
    c.doctor->add_option("JOB", f.job, "abc or jobs/abc")->required();
  }
  if (want("trace")) {
    CLI::App* trace = c.trace = c.app.add_subcommand(
        "trace", "Write every rank's phases of a running job as a Perfetto / Chrome trace");
    trace->add_option("JOB", f.trace.job, "abc or jobs/abc")->required();
    trace->add_option("--steps", f.trace.steps,
                      "Steps A:B (at most 64; default: the last 8 steps rank 0 reported)");
    trace
        ->add_option("--wait", f.trace.wait_seconds,
                     "Seconds to wait for the job to run past the last step (0: ask at once)")
        ->check(CLI::Range(0.0, 86400.0));
    trace->add_option("-o,--output", f.trace.file, "The file to write ('-' for stdout)")
        ->capture_default_str();
  }
  if (want("cancel")) {
    c.cancel = c.app.add_subcommand("cancel", "Cancel a job (its ranks are stopped)");
    c.cancel->add_option("JOB", f.job, "abc or jobs/abc")->required();
  }
  if (want("nodes")) {
    CLI::App* nodes = c.nodes =
        c.app.add_subcommand("nodes", "List the worker nodes (or drain/delete one)");
    nodes->require_subcommand(0, 1);
    c.nodes_list = nodes->add_subcommand("list", "List the worker nodes (the default)");
    CLI::App* drain = c.drain = nodes->add_subcommand(
        "drain", "Admin: place no new work on a node (its running jobs finish unless moved)");
    drain->add_option("NODE", f.drain.node, "gpu-1 or nodes/gpu-1")->required();
    drain->add_flag("--move-jobs", f.drain.move_jobs,
                    "Also stop its running jobs now; they are re-queued without spending "
                    "restarts");
    drain->add_flag("--stop-quarantined", f.drain.stop_quarantined,
                    "Stop the unknown jobs quarantined there after loomd started fresh");
    drain->add_flag("--undo", f.drain.undo, "Undrain: the node takes new work again");
    CLI::App* del = c.del =
        nodes->add_subcommand("delete", "Admin: remove a node so that its devices stop counting");
    del->add_option("NODE", f.delete_node, "gpu-1 or nodes/gpu-1")->required();
    del->add_flag("--force", f.delete_force,
                  "Delete although it is READY or runs jobs (they are re-queued)");
  }
  return cli;
}

std::optional<int> ParseLoomctlArgs(LoomctlCli& cli, int argc, const char* const* argv,
                                    bool report) {
  try {
    cli.app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    if (!report) return kExitInvalidInput;
    const int rc = cli.app.exit(e);  // prints the help or the error
    return rc == 0 ? kExitOk : kExitInvalidInput;
  }
}

std::string_view NamedSubcommand(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i] == nullptr ? "" : argv[i];
    if (arg == "--") return "";
    if (!arg.empty() && arg[0] == '-') {
      // "--server X": X is the option's value, not a subcommand ("--server=X" is one argument).
      for (std::string_view o : kValueOptions) {
        if (arg == o) {
          ++i;
          break;
        }
      }
      continue;
    }
    for (std::string_view s : kSubcommands) {
      if (arg == s) return s;
    }
    return "";
  }
  return "";
}

}  // namespace loom::client
