// `loomctl trace`'s pure parts: the --steps range and the Chrome trace-event file (valid JSON,
// one named process per rank, complete events in microseconds from the earliest one, args).
#include "client/trace_command.h"

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "client/trace_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace loom::client {
namespace {

using ::testing::HasSubstr;

TEST(StepRangeTest, ParsesRangesAndSingleSteps) {
  absl::StatusOr<StepRange> r = ParseStepRange("3:6");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->first, 3);
  EXPECT_EQ(r->last, 6);
  r = ParseStepRange("7");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->first, 7);
  EXPECT_EQ(r->last, 7);
  r = ParseStepRange("");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->first, 0);
  EXPECT_EQ(r->last, 0);
  EXPECT_TRUE(ParseStepRange("1:64").ok());
}

TEST(StepRangeTest, RefusesBadRangesNamingTheFlagAndTheFix) {
  for (const char* bad : {"6:3", "0:2", "-1:2", "a:b", "1:", ":4", "1:2:3", "1:65", "2.5:3"}) {
    absl::StatusOr<StepRange> r = ParseStepRange(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("--steps"));
    EXPECT_THAT(r.status().message(), HasSubstr("A:B"));
  }
  EXPECT_THAT(ParseStepRange("1:65").status().message(), HasSubstr("spans 65 steps"));
  EXPECT_THAT(ParseStepRange("6:3").status().message(), HasSubstr("ends before it starts"));
}

v1::TraceEvent Event(v1::TraceEventKind kind, int64_t start, int64_t dur, int64_t step, int micro,
                     int64_t bytes = 0, int aux = -1) {
  v1::TraceEvent e;
  e.set_kind(kind);
  e.set_start_unix_nanos(start);
  e.set_duration_nanos(dur);
  e.set_step(step);
  e.set_micro_batch(micro);
  e.set_bytes(bytes);
  e.set_aux(aux);
  return e;
}

TEST(TraceJsonTest, WritesOneNamedProcessPerRankAndCompleteEventsInMicroseconds) {
  constexpr int64_t kT0 = 1'700'000'000'123'456'789;
  v1::JobTrace trace;
  trace.set_name("jobs/abc");
  trace.set_generation(2);
  trace.set_first_step(5);
  trace.set_last_step(5);
  trace.add_missing_nodes("nodes/n\"9");
  v1::RankTrace* r0 = trace.add_ranks();
  r0->set_rank(0);
  r0->set_node("nodes/n1");
  *r0->add_events() = Event(v1::TRACE_EVENT_KIND_FORWARD, kT0 + 1500, 2'000'001, 5, 0, 4096, 0);
  *r0->add_events() = Event(v1::TRACE_EVENT_KIND_DP_BUCKET_ALL_REDUCE, kT0, 10, 5, -1, 800, 3);
  v1::RankTrace* r3 = trace.add_ranks();
  r3->set_rank(3);
  r3->set_node("nodes/n2");
  r3->set_stage(1);
  r3->set_data(1);
  *r3->add_events() = Event(v1::TRACE_EVENT_KIND_PP_RECV_ACTIVATION, kT0 + 7, 3, 5, 1, 64, 0);

  std::ostringstream out;
  WriteTraceEventJson(trace, out);
  nlohmann::json j = nlohmann::json::parse(out.str());  // throws on invalid JSON
  EXPECT_EQ(j["otherData"]["job"], "jobs/abc");
  EXPECT_EQ(j["otherData"]["origin_unix_nanos"], kT0);
  EXPECT_EQ(j["otherData"]["missing_nodes"][0], "nodes/n\"9");
  std::map<int, std::string> process_names;
  std::vector<nlohmann::json> complete;
  for (const nlohmann::json& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") {
      process_names[e["pid"].get<int>()] = e["args"]["name"];
    }
    if (e["ph"] == "X") complete.push_back(e);
  }
  EXPECT_EQ(process_names[1], "rank 0 (stage 0, dp 0, tp 0) on nodes/n1");
  EXPECT_EQ(process_names[4], "rank 3 (stage 1, dp 1, tp 0) on nodes/n2");
  ASSERT_EQ(complete.size(), 3u);
  const nlohmann::json& fwd = complete[0];
  EXPECT_EQ(fwd["name"], "forward");
  EXPECT_EQ(fwd["cat"], "compute");
  EXPECT_EQ(fwd["tid"], 1);
  EXPECT_DOUBLE_EQ(fwd["ts"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(fwd["dur"].get<double>(), 2000.001);
  EXPECT_EQ(fwd["args"]["step"], 5);
  EXPECT_EQ(fwd["args"]["micro_batch"], 0);
  EXPECT_EQ(fwd["args"]["bytes"], 4096);
  EXPECT_EQ(fwd["args"]["stage"], 0);
  const nlohmann::json& bucket = complete[1];
  EXPECT_EQ(bucket["tid"], 2);  // the communication thread's own track
  EXPECT_EQ(bucket["args"]["bucket"], 3);
  EXPECT_FALSE(bucket["args"].contains("micro_batch"));
  EXPECT_DOUBLE_EQ(bucket["ts"].get<double>(), 0.0);
  const nlohmann::json& recv = complete[2];
  EXPECT_EQ(recv["pid"], 4);
  EXPECT_EQ(recv["cat"], "pp,wait");
  EXPECT_EQ(recv["args"]["peer_stage"], 0);
}

TEST(TraceJsonTest, AnEmptyTraceIsStillValid) {
  v1::JobTrace trace;
  trace.set_name("jobs/x");
  std::ostringstream out;
  WriteTraceEventJson(trace, out);
  nlohmann::json j = nlohmann::json::parse(out.str());
  EXPECT_TRUE(j["traceEvents"].empty());
}

}  // namespace
}  // namespace loom::client
