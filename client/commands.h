// The loomctl commands. Each returns the process exit code (client/exit_codes.h) and prints
// results on `out` and errors (one line, naming the field or the server) on `err`; none throws.
// loomctl_main.cc only parses flags and calls these.
#pragma once

#include <functional>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/connection.h"
#include "client/job_follower.h"
#include "client/output_format.h"
#include "loom/v1/job.pb.h"

namespace loom::client {

struct CommandContext {
  Connection* connection = nullptr;
  OutputFormat format = OutputFormat::kTable;
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
  // Whether `out` / `err` are terminals: the progress line is then redrawn in place.
  bool out_is_tty = false;
  bool err_is_tty = false;
  FollowOptions follow;
  std::function<absl::Time()> now = [] { return absl::Now(); };
};

struct SubmitArgs {
  // The YAML specs, a job each; "-" (alone) for standard input. Several: submit_many.h.
  std::vector<std::string> files;
  bool wait = false;       // follow the job to its end; exit 1 if it fails or is cancelled
  std::string request_id{};  // idempotency key; a fresh random one when empty
};

struct LogsArgs {
  std::string job;
  bool follow = false;
  std::optional<int> rank{};
};

struct PlanArgs {
  std::string file;     // the YAML spec; "-" for standard input
  std::string cluster;  // a cluster file (DESIGN.md): plan offline; empty: PlanJob on the server
  int top_k = 0;        // plans to show; 0: the server's default (5)
};

int RunSubmit(CommandContext& ctx, const SubmitArgs& args);
// Ranks the layouts of a spec. With a cluster file, offline through the planner library (the
// same mapping loomd uses, server/planner_service); else with PlanJob on the live cluster.
// `ctx.connection` may be null with a cluster file.
int RunPlan(CommandContext& ctx, const PlanArgs& args);
// `wait`: block until the job ends, then print it and exit 1 if it failed or was cancelled.
int RunGet(CommandContext& ctx, const std::string& job, bool wait);
// `state`: empty for all jobs, else a state name in any case ("running").
int RunList(CommandContext& ctx, const std::string& state);
int RunWatch(CommandContext& ctx, const std::string& job);
int RunLogs(CommandContext& ctx, const LogsArgs& args);
int RunCancel(CommandContext& ctx, const std::string& job);
int RunNodes(CommandContext& ctx);
// The doctor's findings about a job (GetJobReport): a table, or the JobReport as JSON / YAML.
int RunDoctor(CommandContext& ctx, const std::string& job);

struct DrainArgs {
  std::string node;               // gpu-1 or nodes/gpu-1
  bool move_jobs = false;         // also move its running gangs (no restart spent)
  bool stop_quarantined = false;  // stop the gangs quarantined there after a fresh start
  bool undo = false;              // undrain: the node takes work again
};
// Admin: no new work on the node (DrainNode).
int RunDrainNode(CommandContext& ctx, const DrainArgs& args);
// Admin: removes the node from loomd (DeleteNode); refused while it is READY or runs work
// unless `force`.
int RunDeleteNode(CommandContext& ctx, const std::string& node, bool force);

// "running", "RUNNING" -> RUNNING. INVALID_ARGUMENT listing the states otherwise.
absl::StatusOr<loom::v1::JobState> ParseJobState(const std::string& text);

}  // namespace loom::client
