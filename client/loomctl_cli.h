// loomctl's command line: its flags and subcommands (CLI11), and what they fill in.
//
// Defining every subcommand's options costs a CLI call more than the call itself: CLI11 builds
// an object per option, about 0.7 M instructions for all of them against 0.13 M for a submit's
// own work. So loomctl defines only the subcommand its arguments name (NamedSubcommand) and
// parses with that. Whenever that parse fails (an error, --help), it parses again with every
// subcommand defined, so what is printed is what the full command line prints.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "client/commands.h"
#include "client/scale_test_command.h"
#include "client/trace_command.h"
#include "common/tls_files.h"

namespace loom::client {

// The values the command line sets, with their defaults.
struct LoomctlFlags {
  std::string server;
  std::string output = "table";
  double timeout_seconds = 10;
  std::string token, token_file;
  loom::TlsFiles tls;
  bool insecure = false;
  std::string persist;  // --persist DURATION (empty: $LOOM_PERSIST)

  SubmitArgs submit;
  PlanArgs plan;
  ScaleTestArgs scale;
  std::string job;  // get, watch, doctor, cancel
  bool get_wait = false;
  std::string state;  // list
  LogsArgs logs;
  std::optional<int> rank;  // logs
  TraceArgs trace;
  DrainArgs drain;
  std::string delete_node;
  bool delete_force = false;
};

// The parser and what it fills in. Subcommands that were not defined stay null.
struct LoomctlCli {
  CLI::App app{"loomctl: submit, follow and inspect Loom training jobs"};
  LoomctlFlags flags;
  CLI::App* submit = nullptr;
  CLI::App* plan = nullptr;
  CLI::App* scale = nullptr;
  CLI::App* get = nullptr;
  CLI::App* list = nullptr;
  CLI::App* watch = nullptr;
  CLI::App* logs = nullptr;
  CLI::App* doctor = nullptr;
  CLI::App* trace = nullptr;
  CLI::App* cancel = nullptr;
  CLI::App* nodes = nullptr;
  CLI::App* nodes_list = nullptr;
  CLI::App* drain = nullptr;
  CLI::App* del = nullptr;

  // Whether subcommand `sub` was defined and given.
  static bool Given(const CLI::App* sub) { return sub != nullptr && sub->parsed(); }
};

// The global flags and the subcommand `only` ("nodes" with its own subcommands); every
// subcommand when `only` is empty. Heap-allocated: CLI11 keeps pointers into `flags`.
std::unique_ptr<LoomctlCli> BuildLoomctlCli(std::string_view only);

// Parses the arguments into `cli`. nullopt on success. Else, when `report`, prints the help or
// the error and returns the exit code (0 after --help, kExitInvalidInput after an error); when
// not, prints nothing and returns kExitInvalidInput (the caller parses again to report).
std::optional<int> ParseLoomctlArgs(LoomctlCli& cli, int argc, const char* const* argv,
                                    bool report);

// The subcommand the arguments name: the first argument that is not an option or the value of
// a global option, when it is a subcommand's name; empty otherwise (none, an unknown word, or
// anything after "--"), which means "define them all".
std::string_view NamedSubcommand(int argc, const char* const* argv);

}  // namespace loom::client
