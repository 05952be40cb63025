// loomctl's command line (client/loomctl_cli.h): the subcommand found in the arguments, and
// parsing with only that subcommand defined gives what parsing with all of them gives.
#include "client/loomctl_cli.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::client {
namespace {

std::string_view Named(std::vector<const char*> args) {
  args.insert(args.begin(), "loomctl");
  return NamedSubcommand(static_cast<int>(args.size()), args.data());
}

TEST(LoomctlCliTest, NamedSubcommandSkipsGlobalOptionsAndTheirValues) {
  EXPECT_EQ(Named({"submit", "-f", "job.yaml"}), "submit");
  EXPECT_EQ(Named({"--server", "get", "list"}), "list");  // a server called "get"
  EXPECT_EQ(Named({"--server=h:1", "-o", "json", "get", "j1"}), "get");
  EXPECT_EQ(Named({"--insecure", "--timeout", "3", "nodes", "drain", "n1"}), "nodes");
  EXPECT_EQ(Named({"-ojson", "scale-test", "-f", "x"}), "scale-test");
  EXPECT_EQ(Named({}), "");
  EXPECT_EQ(Named({"--help"}), "");
  EXPECT_EQ(Named({"sumbit", "-f", "x"}), "");  // unknown: every subcommand, for CLI11's error
  EXPECT_EQ(Named({"--", "submit"}), "");
  EXPECT_EQ(Named({"--server"}), "");
}

// NamedSubcommand's own list of the global options that take a value (it runs before any
// option is defined) matches what BuildLoomctlCli defines: each one's value is skipped.
TEST(LoomctlCliTest, NamedSubcommandSkipsTheValueOfEveryGlobalOption) {
  const std::unique_ptr<LoomctlCli> cli = BuildLoomctlCli("get");
  int checked = 0;
  for (const CLI::Option* option : cli->app.get_options()) {
    if (option->get_items_expected_min() == 0) continue;  // a flag (or --help): no value
    std::vector<std::string> names;
    for (const std::string& n : option->get_lnames()) names.push_back("--" + n);
    for (const std::string& n : option->get_snames()) names.push_back("-" + n);
    for (const std::string& name : names) {
      EXPECT_EQ(Named({name.c_str(), "get", "list"}), "list") << name;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 10);  // --server, -o/--output, --timeout, --token-file, --token, --tls-*,
                           // --persist
}

// Everything a parse set, as text, to compare two parses.
std::string Summary(const LoomctlCli& c) {
  const LoomctlFlags& f = c.flags;
  std::vector<std::string> given;
  for (const auto& [name, sub] :
       std::vector<std::pair<std::string, const CLI::App*>>{{"submit", c.submit},
                                                            {"plan", c.plan},
                                                            {"scale", c.scale},
                                                            {"get", c.get},
                                                            {"list", c.list},
                                                            {"watch", c.watch},
                                                            {"logs", c.logs},
                                                            {"doctor", c.doctor},
                                                            {"trace", c.trace},
                                                            {"cancel", c.cancel},
                                                            {"nodes", c.nodes},
                                                            {"nodes_list", c.nodes_list},
                                                            {"drain", c.drain},
                                                            {"del", c.del}}) {
    if (LoomctlCli::Given(sub)) given.push_back(name);
  }
  return absl::StrCat(
      "given=", absl::StrJoin(given, ","), " server=", f.server, " output=", f.output,
      " timeout=", f.timeout_seconds, " token=", f.token, " token_file=", f.token_file,
      " tls=", f.tls.ca, "|", f.tls.cert, "|", f.tls.key, " insecure=", f.insecure,
      " submit=", absl::StrJoin(f.submit.files, ","), "|", f.submit.wait, "|", f.submit.request_id,
      " plan=", f.plan.file, "|", f.plan.cluster, "|", f.plan.top_k, " scale=", f.scale.file, "|",
      f.scale.devices, "|", f.scale.weak, "|", f.scale.steps, "|", f.scale.plot, "|",
      f.scale.request_id, " job=", f.job, " get_wait=", f.get_wait, " state=", f.state,
      " logs=", f.logs.job, "|", f.logs.follow,
      " rank=", f.rank.has_value() ? absl::StrCat(*f.rank) : "none", " trace=", f.trace.job, "|",
      f.trace.steps, "|", f.trace.file, "|", f.trace.wait_seconds, " drain=", f.drain.node, "|",
      f.drain.move_jobs, "|", f.drain.stop_quarantined, "|", f.drain.undo,
      " delete=", f.delete_node, "|", f.delete_force);
}

// For every command line here, loomctl's way (the named subcommand only) and the full
// definition accept or refuse it alike, and set the same values.
TEST(LoomctlCliTest, TheNamedSubcommandAloneParsesAsTheFullCommandLine) {
  const std::vector<std::vector<const char*>> lines = {
      {"submit", "-f", "a.yaml"},
      {"submit", "-f", "a.yaml", "-f", "b.yaml", "--request-id", "r", "--wait"},
      {"--server", "h:1", "submit", "--file=a.yaml", "-o", "json"},
      {"submit", "-f", "a.yaml", "--server=h:2", "--insecure", "--timeout", "2.5"},
      {"submit"},                             // -f is required
      {"submit", "-f", "a.yaml", "--bogus"},  // unknown flag
      {"submit", "-f", "a.yaml", "get", "j"},
      {"plan", "-f", "a.yaml", "--top", "3", "--cluster", "c.yaml"},
      {"plan", "-f", "a.yaml", "--top", "99"},  // out of range
      {"scale-test", "-f", "a.yaml", "--devices", "1,2", "--weak", "--steps", "8"},
      {"get", "j1", "--wait"},
      {"get"},
      {"--token-file", "t", "list", "--state", "running"},
      {"watch", "jobs/j1"},
      {"logs", "j1", "-f", "--rank", "2"},
      {"logs", "j1", "--rank", "x"},
      {"doctor", "j1"},
      {"trace", "j1", "--steps", "3:9", "-o", "-", "--wait", "0"},
      {"cancel", "j1", "-o", "yaml"},
      {"-o", "xml", "cancel", "j1"},
      {"nodes"},
      {"nodes", "list"},
      {"nodes", "drain", "gpu-1", "--move-jobs", "--undo"},
      {"nodes", "delete", "gpu-1", "--force"},
      {"nodes", "bogus"},
      {"--tls-ca", "ca.pem", "--tls-cert", "c.pem", "--tls-key", "k.pem", "get", "j"},
  };
  int accepted = 0, refused = 0;
  for (std::vector<const char*> line : lines) {
    line.insert(line.begin(), "loomctl");
    const int argc = static_cast<int>(line.size());
    SCOPED_TRACE(absl::StrJoin(line, " "));
    const std::string_view only = NamedSubcommand(argc, line.data());
    std::unique_ptr<LoomctlCli> named = BuildLoomctlCli(only);
    std::unique_ptr<LoomctlCli> full = BuildLoomctlCli("");
    const std::optional<int> named_rc = ParseLoomctlArgs(*named, argc, line.data(), false);
    const std::optional<int> full_rc = ParseLoomctlArgs(*full, argc, line.data(), false);
    EXPECT_EQ(named_rc.has_value(), full_rc.has_value());
    if (!named_rc.has_value() && !full_rc.has_value()) {
      EXPECT_EQ(Summary(*named), Summary(*full));
    }
    ++(full_rc.has_value() ? refused : accepted);
  }
  // Both kinds are compared (the list above is not all errors, nor all fine).
  EXPECT_GE(accepted, 15);
  EXPECT_GE(refused, 7);
}

}  // namespace
}  // namespace loom::client
