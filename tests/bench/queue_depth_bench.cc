// Queue-depth benchmark: what loomd's job manager costs while N jobs wait, in process. Plain
// main; prints a table.
//
// The cluster is one node of 8 CPU devices, taken by a running 8-device job; N more 8-device jobs
// wait behind it (N = 0, 1,000, 5,000, 10,000). Two figures per N:
//  - tick: one JobManager::Tick() with nothing changed (loomd runs one every 100 ms: node
//    timeouts, watchdogs, progress writes, the doctor, and a scheduling pass when one can help);
//    what a loomd costs at rest with that queue is ten of these a second, under its one lock.
//  - turnover: the running gang's 8 ranks exit, the next queued job is placed (a scheduling
//    pass over the queue) and its 8 ranks report running: one back-to-back gang change.
// Both run on the memory store (the figure is the manager's own work, not SQLite's) and a fake
// clock advanced by 100 ms per tick. Each is repeated; the table gives the median and minimum.
//
//   usage: queue_depth_bench [repetitions]   (default 31)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "server/jobs/default_spec_validator.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/log_store.h"
#include "server/store/job_store.h"
#include "tests/server/loomd_test_util.h"

namespace {

using loom::testing::CpuNode;
using loom::testing::CpuSpec;
using loom::testing::CreateRequest;
using loom::testing::FakeSink;
using loom::testing::RankExit;
using loom::testing::RankPhase;

constexpr int kDevices = 8;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The manager logs a line per created job and per transition to stderr, which goes to /dev/null
// while the bench runs (the writes stay in the figures, as in loomd); errors go to the real one.
FILE* errors = stderr;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(errors, "queue_depth_bench: %s\n", what.c_str());
  std::exit(1);
}

double MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

struct Row {
  int queued;
  double tick_median_ms, tick_min_ms, turnover_median_ms, turnover_min_ms;
};

Row Measure(int queued, int reps, const std::string& log_dir) {
  loom::FakeClock clock;
  std::unique_ptr<loom::store::JobStore> store = loom::store::NewMemoryJobStore();
  auto logs = loom::jobs::LogStore::Open(log_dir);
  if (!logs.ok()) Die(std::string(logs.status().message()));
  loom::jobs::JobManagerOptions options;
  options.rendezvous_address = "loomd.bench:7070";
  options.node_timeout = absl::Hours(24);  // the fake clock runs a second per 1,000 creates
  auto manager = loom::jobs::JobManager::Create(
      store.get(), &clock, loom::jobs::MakeSpecValidator(), logs->get(), nullptr, nullptr, options);
  if (!manager.ok()) Die(std::string(manager.status().message()));
  loom::jobs::JobManager& m = **manager;

  if (!m.RegisterNode(CpuNode("n1", kDevices)).ok()) Die("cannot register the node");
  auto sink = std::make_shared<FakeSink>();
  loom::v1::SessionHello hello;
  hello.set_node_id("n1");
  absl::StatusOr<uint64_t> session = m.OpenSession(hello, sink);
  if (!session.ok()) Die(std::string(session.status().message()));

  // Starts the gang of the assignment just sent; returns its job name.
  auto start_assigned = [&]() -> std::string {
    std::vector<loom::v1::Assignment> assigned = sink->TakeAssignments();
    if (assigned.size() != 1)
      Die("expected one assignment, got " + std::to_string(assigned.size()));
    const loom::v1::Assignment& a = assigned[0];
    for (int r = 0; r < kDevices; ++r) {
      absl::Status s = m.HandleWorkerMessage(
          "n1", *session, RankPhase(a.job(), a.generation(), r, loom::v1::RANK_PHASE_RUNNING));
      if (!s.ok()) Die(std::string(s.message()));
    }
    return a.job();
  };

  if (!m.CreateJob(CreateRequest(CpuSpec(kDevices))).ok()) Die("cannot create the first job");
  std::string running = start_assigned();
  // One extra per turnover keeps the queue at `queued` through the measurement.
  for (int i = 0; i < queued + reps + 1; ++i) {
    clock.Advance(absl::Milliseconds(1));  // job ids carry the creation millisecond
    absl::StatusOr<loom::v1::Job> job = m.CreateJob(CreateRequest(CpuSpec(kDevices)));
    if (!job.ok()) Die(std::string(job.status().message()));
  }
  // The first tick after the burst writes the newcomers' waiting reasons; not measured.
  clock.Advance(absl::Milliseconds(100));
  m.Tick();

  std::vector<double> ticks, turnovers;
  for (int rep = 0; rep < reps; ++rep) {
    clock.Advance(absl::Milliseconds(100));
    auto start = std::chrono::steady_clock::now();
    m.Tick();
    ticks.push_back(MillisSince(start));
  }
  for (int rep = 0; rep < reps; ++rep) {
    auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < kDevices; ++r) {
      absl::Status s = m.HandleWorkerMessage("n1", *session,
                                             RankExit(running, 1, r, loom::v1::EXIT_CLASS_SUCCESS));
      if (!s.ok()) Die(std::string(s.message()));
    }
    running = start_assigned();
    turnovers.push_back(MillisSince(start));
  }
  m.Shutdown();
  return {queued, Median(ticks), *std::min_element(ticks.begin(), ticks.end()), Median(turnovers),
          *std::min_element(turnovers.begin(), turnovers.end())};
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 31;
  errors = ::fdopen(::dup(STDERR_FILENO), "w");
  if (errors == nullptr || std::freopen("/dev/null", "w", stderr) == nullptr) return 1;
  char pattern[] = "/tmp/loom-queue-bench-XXXXXX";
  if (::mkdtemp(pattern) == nullptr) Die("cannot make a temporary directory");
  std::printf("%8s  %14s  %11s  %18s  %15s\n", "queued", "tick median ms", "tick min ms",
              "turnover median ms", "turnover min ms");
  for (int queued : {0, 1000, 5000, 10000}) {
    const Row row = Measure(queued, reps, std::string(pattern) + "/logs-" + std::to_string(queued));
    std::printf("%8d  %14.3f  %11.3f  %18.3f  %15.3f\n", row.queued, row.tick_median_ms,
                row.tick_min_ms, row.turnover_median_ms, row.turnover_min_ms);
    std::fflush(stdout);
  }
  std::error_code ec;
  std::filesystem::remove_all(pattern, ec);
  return 0;
}
