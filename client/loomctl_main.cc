// loomctl: the command-line client of Loom. The flags are client/loomctl_cli.h, the commands
// client/commands.cc; this file connects and dispatches. Exit codes: client/exit_codes.h.
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
#include "client/loomctl_cli.h"
#include "client/output_format.h"
#include "client/persist_mux.h"
#include "client/scale_test_command.h"
#include "client/trace_command.h"
#include "common/tls_files.h"

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
  // The persistent connection's background process (client/persist_mux.h), started by loomctl.
  if (argc >= 2 && std::string_view(argv[1]) == "--persist-mux") return RunPersistMux(argc, argv);

  // Only the subcommand named is defined (client/loomctl_cli.h); a parse that fails (an
  // error, --help) is repeated with all of them, so that its output is the full CLI's.
  const std::string_view only = NamedSubcommand(argc, argv);
  std::unique_ptr<LoomctlCli> cli = BuildLoomctlCli(only);
  std::optional<int> failed = ParseLoomctlArgs(*cli, argc, argv, /*report=*/only.empty());
  if (failed.has_value() && !only.empty()) {
    cli = BuildLoomctlCli("");
    failed = ParseLoomctlArgs(*cli, argc, argv, /*report=*/true);
  }
  if (failed.has_value()) return *failed;
  LoomctlFlags& f = cli->flags;
  loom::TlsFiles& tls = f.tls;

  if (tls.ca.empty()) {
    if (const char* env = std::getenv("LOOM_TLS_CA"); env != nullptr) tls.ca = env;
  }
  const std::string address = ResolveServerAddress(f.server);
  absl::StatusOr<bool> plaintext = loom::ChannelIsPlaintext(tls, f.insecure, address, "--tls");
  absl::StatusOr<std::string> bearer = ResolveToken(f.token, f.token_file);
  for (const absl::Status& s : {plaintext.status(), bearer.status()}) {
    if (!s.ok()) {
      std::cerr << "loomctl: " << s.message() << "\n";
      return kExitInvalidInput;
    }
  }
  const absl::Duration rpc_timeout =
      absl::Milliseconds(static_cast<int64_t>(f.timeout_seconds * 1000));
  // Every call goes on the wire (client/wire_client.h): loomctl does not link gRPC's runtime.
  // TLS verifies loomd against --tls-ca, or the system's roots when none is given.
  std::unique_ptr<Connection> connection =
      *plaintext ? std::make_unique<Connection>(address, rpc_timeout, *bearer)
                 : std::make_unique<Connection>(address, rpc_timeout, *bearer,
                                                WireTls{tls.ca, tls.cert, tls.key});
  if (f.persist.empty()) {
    if (const char* env = std::getenv("LOOM_PERSIST"); env != nullptr) f.persist = env;
  }
  if (!f.persist.empty()) {
    absl::Duration idle;  // "0" parses as zero: off
    if (!absl::ParseDuration(f.persist, &idle) || idle < absl::ZeroDuration() ||
        idle > absl::Hours(24)) {
      std::cerr << "loomctl: --persist (or LOOM_PERSIST): \"" << f.persist
                << "\" is not a duration between 0 and 24h; write it like 60s or 10m\n";
      return kExitInvalidInput;
    }
    if (idle > absl::ZeroDuration()) connection->UsePersistentConnection(idle, &std::cerr);
  } else if (!*plaintext) {
    // Over TLS the handshake costs a call more CPU than everything else it does; a loop of
    // calls shares one connection unless told not to (client/persist_mux.h, "Automatic").
    connection->UsePersistentConnection(kAutoPersistIdle, nullptr, /*automatic=*/true);
  }
  CommandContext ctx;
  ctx.connection = connection.get();
  ctx.format = *ParseOutputFormat(f.output);  // checked by CLI::IsMember above
  ctx.out = &std::cout;
  ctx.err = &std::cerr;
  ctx.out_is_tty = isatty(STDOUT_FILENO) == 1;
  ctx.err_is_tty = isatty(STDERR_FILENO) == 1;

  const LoomctlCli& c = *cli;
  if (LoomctlCli::Given(c.submit)) return Finish(RunSubmit(ctx, f.submit));
  if (LoomctlCli::Given(c.plan)) return Finish(RunPlan(ctx, f.plan));
  if (LoomctlCli::Given(c.get)) return Finish(RunGet(ctx, f.job, f.get_wait));
  if (LoomctlCli::Given(c.list)) return Finish(RunList(ctx, f.state));
  if (LoomctlCli::Given(c.watch)) return Finish(RunWatch(ctx, f.job));
  if (LoomctlCli::Given(c.logs)) {
    f.logs.rank = f.rank;
    return Finish(RunLogs(ctx, f.logs));
  }
  if (LoomctlCli::Given(c.cancel)) return Finish(RunCancel(ctx, f.job));
  if (LoomctlCli::Given(c.doctor)) return Finish(RunDoctor(ctx, f.job));
  if (LoomctlCli::Given(c.scale)) return Finish(RunScaleTest(ctx, f.scale));
  if (LoomctlCli::Given(c.trace)) return Finish(RunTrace(ctx, f.trace));
  if (LoomctlCli::Given(c.drain)) return Finish(RunDrainNode(ctx, f.drain));
  if (LoomctlCli::Given(c.del)) return Finish(RunDeleteNode(ctx, f.delete_node, f.delete_force));
  if (LoomctlCli::Given(c.nodes) || LoomctlCli::Given(c.nodes_list)) return Finish(RunNodes(ctx));
  return kExitInvalidInput;
}
