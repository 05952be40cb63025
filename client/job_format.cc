#include "client/job_format.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/timestamp.pb.h"

namespace loom::client {
namespace {

using loom::v1::Job;
using loom::v1::JobState;

bool IsSet(const google::protobuf::Timestamp& ts) { return ts.seconds() != 0 || ts.nanos() != 0; }

absl::Time ToTime(const google::protobuf::Timestamp& ts) {
  return absl::FromUnixSeconds(ts.seconds()) + absl::Nanoseconds(ts.nanos());
}

std::string FormatTimestamp(const google::protobuf::Timestamp& ts, absl::Time now) {
  if (!IsSet(ts)) return "-";
  const absl::Time t = ToTime(ts);
  return absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone()), " (",
                      FormatShortDuration(now - t), " ago)");
}

std::string FormatAge(const google::protobuf::Timestamp& ts, absl::Time now) {
  return IsSet(ts) ? FormatShortDuration(now - ToTime(ts)) : "-";
}

std::string FormatRate(double tokens_per_second) {
  if (tokens_per_second >= 1e6) return absl::StrFormat("%.2fM", tokens_per_second / 1e6);
  if (tokens_per_second >= 1e4) return absl::StrFormat("%.0fk", tokens_per_second / 1e3);
  if (tokens_per_second >= 1e3) return absl::StrFormat("%.1fk", tokens_per_second / 1e3);
  return absl::StrFormat("%.0f", tokens_per_second);
}

std::string FormatStep(const loom::v1::JobProgress& p) {
  if (p.total_steps() > 0) return absl::StrCat(p.step(), "/", p.total_steps());
  if (p.step() > 0) return absl::StrCat(p.step());
  return "-";
}

std::string FormatDevices(const loom::v1::JobSpec& spec) {
  if (spec.resources().gpus() > 0) return absl::StrCat(spec.resources().gpus(), " gpu");
  if (spec.resources().cpu_devices() > 0) {
    return absl::StrCat(spec.resources().cpu_devices(), " cpu");
  }
  return "-";
}

std::string FormatModel(const loom::v1::ModelSpec& m) {
  if (!m.preset().empty()) return m.preset();
  if (m.layers() == 0) return "-";
  return absl::StrFormat("L=%d C=%d NH=%d T=%d V=%d", m.layers(), m.hidden(), m.heads(),
                         m.seq_len(), m.vocab());
}

// Left-aligned columns separated by two spaces; the last column is not padded.
std::string Columns(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

template <typename T>
std::string JoinInts(const google::protobuf::RepeatedField<T>& values) {
  return values.empty() ? "-" : absl::StrJoin(values, ",");
}

}  // namespace

std::string JobStateName(JobState state) {
  if (state == loom::v1::JOB_STATE_UNSPECIFIED || !loom::v1::JobState_IsValid(state)) {
    return "UNKNOWN";
  }
  return loom::v1::JobState_Name(state);
}

std::string NodeStateName(loom::v1::NodeState state) {
  switch (state) {
    case loom::v1::NODE_STATE_READY:
      return "READY";
    case loom::v1::NODE_STATE_LOST:
      return "LOST";
    default:
      return "UNKNOWN";
  }
}

bool IsTerminal(JobState state) {
  return state == loom::v1::SUCCEEDED || state == loom::v1::FAILED || state == loom::v1::CANCELLED;
}

std::string FormatShortDuration(absl::Duration d) {
  if (d < absl::ZeroDuration()) d = absl::ZeroDuration();
  const int64_t s = absl::ToInt64Seconds(d);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, (s % 86400) / 3600);
}

std::string FormatProgressLine(const Job& job) {
  const loom::v1::JobProgress& p = job.progress();
  std::string line = absl::StrCat(job.name(), " ", JobStateName(job.state()));
  if (job.restart_count() > 0) absl::StrAppend(&line, " (restart ", job.restart_count(), ")");
  if (p.total_steps() > 0) {
    const double pct = 100.0 * static_cast<double>(p.step()) / static_cast<double>(p.total_steps());
    absl::StrAppend(&line,
                    absl::StrFormat("  step %d/%d (%.0f%%)", p.step(), p.total_steps(), pct));
  } else if (p.step() > 0) {
    absl::StrAppend(&line, "  step ", p.step());
  }
  if (p.step() > 0) absl::StrAppend(&line, absl::StrFormat("  loss %.4f", p.loss()));
  if (p.tokens_per_second() > 0) {
    absl::StrAppend(&line, "  ", FormatRate(p.tokens_per_second()), " tok/s");
  }
  if (p.eta_seconds() > 0 && !IsTerminal(job.state())) {
    absl::StrAppend(&line, "  ETA ", FormatShortDuration(absl::Seconds(p.eta_seconds())));
  }
  return line;
}

std::string FormatOutcomeLine(const Job& job) {
  std::string line = absl::StrCat(job.name(), " ", JobStateName(job.state()));
  if (job.state() == loom::v1::SUCCEEDED && IsSet(job.start_time()) && IsSet(job.end_time())) {
    absl::StrAppend(&line, " in ",
                    FormatShortDuration(ToTime(job.end_time()) - ToTime(job.start_time())));
  }
  if (job.restart_count() > 0) {
    absl::StrAppend(&line, " after ", job.restart_count(),
                    job.restart_count() == 1 ? " restart" : " restarts");
  }
  if (job.state() == loom::v1::SUCCEEDED && job.progress().step() > 0) {
    absl::StrAppend(&line, absl::StrFormat(" (%d steps, final loss %.4f)", job.progress().step(),
                                           job.progress().loss()));
  } else if (!job.state_reason().empty()) {
    absl::StrAppend(&line, ": ", job.state_reason());
  }
  return line;
}

std::string FormatGoodput(const loom::v1::Goodput& g) {
  std::string out = absl::StrFormat("%.0f%% (productive %.1f s of %.1f s", g.ratio() * 100,
                                    g.productive_seconds(), g.wall_seconds());
  const std::pair<const char*, double> buckets[] = {{"queued", g.queued_seconds()},
                                                    {"starting", g.starting_seconds()},
                                                    {"checkpointing", g.checkpointing_seconds()},
                                                    {"restarts", g.restart_seconds()},
                                                    {"rebalancing", g.rebalance_seconds()},
                                                    {"other", g.other_seconds()}};
  const char* sep = "; ";
  for (const auto& [name, seconds] : buckets) {
    if (seconds < 0.05) continue;
    absl::StrAppendFormat(&out, "%s%s %.1f s", sep, name, seconds);
    if (std::string_view(name) == "restarts" && g.steps_lost() > 0) {
      absl::StrAppend(&out, " (", g.steps_lost(), " steps trained again)");
    }
    sep = ", ";
  }
  return out + ")";
}

std::string FormatJobDetails(const Job& job, absl::Time now) {
  std::vector<std::vector<std::string>> kv;
  kv.push_back({"Name:", job.name()});
  std::string state = JobStateName(job.state());
  if (!job.state_reason().empty()) absl::StrAppend(&state, " (", job.state_reason(), ")");
  kv.push_back({"State:", state});
  kv.push_back(
      {"Spec:", absl::StrCat(job.spec().name().empty() ? "-" : job.spec().name(), ", model ",
                             FormatModel(job.spec().model()), ", ", FormatDevices(job.spec()), ", ",
                             job.spec().train().steps(), " steps")});
  const loom::v1::Layout& l = job.layout();
  kv.push_back({"Layout:", l.data() == 0
                               ? "-"
                               : absl::StrFormat("data=%d tensor=%d pipeline=%d "
                                                 "micro_batch=%d num_micro_batches=%d",
                                                 l.data(), l.tensor(), l.pipeline(),
                                                 l.micro_batch(), l.num_micro_batches())});
  if (job.has_plan()) {
    // The planner's prediction for an `auto` job, to compare with the progress below.
    const loom::v1::Plan& plan = job.plan();
    kv.push_back({"Predicted:",
                  absl::StrFormat("%.3f s/step, %.0f tokens/s, MFU %.1f%%, peak "
                                  "%.2f GiB per device",
                                  plan.step_seconds(), plan.tokens_per_second(), plan.mfu() * 100,
                                  plan.memory().total() / (1024.0 * 1024 * 1024))});
    if (job.has_plan_check() && job.plan_check().measured_steps() > 0) {
      // Measured beside predicted: the median of rank 0's recent steps, warmup excluded.
      const loom::v1::PlanCheck& check = job.plan_check();
      kv.push_back({"Measured:", absl::StrFormat("%.3f s/step (%.2fx predicted, median of %d "
                                                 "steps)",
                                                 check.measured_step_seconds(), check.ratio(),
                                                 check.measured_steps())});
    }
  }
  if (job.has_goodput() && job.goodput().wall_seconds() > 0) {
    kv.push_back({"Goodput:", FormatGoodput(job.goodput())});
  }
  kv.push_back(
      {"Generation:", absl::StrCat(job.generation(), " (", job.restart_count(),
                                   job.restart_count() == 1 ? " restart)" : " restarts)")});
  const std::string progress = FormatProgressLine(job);
  const size_t cut = progress.find("  ");
  kv.push_back({"Progress:", cut == std::string::npos ? "-" : progress.substr(cut + 2)});
  kv.push_back({"Created:", FormatTimestamp(job.create_time(), now)});
  kv.push_back({"Started:", FormatTimestamp(job.start_time(), now)});
  kv.push_back({"Ended:", FormatTimestamp(job.end_time(), now)});
  if (!job.request_id().empty()) kv.push_back({"Request id:", job.request_id()});
  std::string out = Columns(kv);
  if (!job.placements().empty()) {
    std::vector<std::vector<std::string>> rows = {{"  NODE", "RANKS", "DEVICES"}};
    for (const auto& p : job.placements()) {
      rows.push_back(
          {absl::StrCat("  ", p.node()), JoinInts(p.ranks()), JoinInts(p.device_indices())});
    }
    absl::StrAppend(&out, "Placements:\n", Columns(rows));
  }
  if (!job.events().empty()) {
    std::vector<std::vector<std::string>> rows = {{"  TIME", "GEN", "TRANSITION", "REASON"}};
    for (const auto& e : job.events()) {
      rows.push_back({absl::StrCat("  ", IsSet(e.time()) ? absl::FormatTime("%Y-%m-%dT%H:%M:%SZ",
                                                                            ToTime(e.time()),
                                                                            absl::UTCTimeZone())
                                                         : "-"),
                      absl::StrCat(e.generation()),
                      absl::StrCat(e.from_state() == loom::v1::JOB_STATE_UNSPECIFIED
                                       ? "(new)"
                                       : JobStateName(e.from_state()),
                                   " -> ", JobStateName(e.to_state())),
                      e.reason()});
    }
    absl::StrAppend(&out, "Events:\n", Columns(rows));
  }
  return out;
}

std::string FormatColumns(const std::vector<std::vector<std::string>>& rows) {
  return Columns(rows);
}

std::string FormatJobTable(const std::vector<Job>& jobs, absl::Time now) {
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "STATE", "STEP", "LOSS", "DEVICES", "AGE"}};
  for (const Job& job : jobs) {
    rows.push_back(
        {job.name(), JobStateName(job.state()), FormatStep(job.progress()),
         job.progress().step() > 0 ? absl::StrFormat("%.4f", job.progress().loss()) : "-",
         FormatDevices(job.spec()), FormatAge(job.create_time(), now)});
  }
  return Columns(rows);
}

std::string FormatNodeTable(const std::vector<loom::v1::Node>& nodes, absl::Time now) {
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "STATE", "DEVICES", "ALLOCATED", "ADDRESS", "HEARTBEAT"}};
  for (const loom::v1::Node& node : nodes) {
    // Count devices by kind and model: "2 cpu", "8 gpu (NVIDIA H200)".
    std::map<std::string, int> kinds;
    for (const auto& d : node.devices()) {
      const bool gpu = d.kind() == loom::v1::DEVICE_KIND_GPU;
      kinds[gpu ? absl::StrCat("gpu (", d.model(), ")") : "cpu"]++;
    }
    std::vector<std::string> parts;
    for (const auto& [kind, n] : kinds) parts.push_back(absl::StrCat(n, " ", kind));
    // READY alone means schedulable; what keeps work off a READY node is said beside it.
    std::string state = NodeStateName(node.state());
    if (node.draining()) absl::StrAppend(&state, ",draining");
    if (!node.unhealthy_reason().empty()) absl::StrAppend(&state, ",unhealthy");
    if (node.quarantined_size() > 0) {
      absl::StrAppend(&state, ",quarantined:", node.quarantined_size());
    }
    rows.push_back({node.name(), state, parts.empty() ? "-" : absl::StrJoin(parts, ", "),
                    absl::StrCat(node.allocated_devices_size(), "/", node.devices_size()),
                    node.address().empty() ? "-" : node.address(),
                    IsSet(node.last_heartbeat())
                        ? absl::StrCat(FormatAge(node.last_heartbeat(), now), " ago")
                        : "-"});
  }
  return Columns(rows);
}

std::string FormatLogLine(const loom::v1::LogLine& line) {
  return absl::StrCat("[gen ", line.generation(), " rank ", line.rank(),
                      line.stream() == "stderr" ? " stderr" : "", "] ", line.text());
}

}  // namespace loom::client
