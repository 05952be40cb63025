// SessionClient against an in-process fake NodeService (port 0): registration, hello,
// heartbeats, an assignment executed by a real supervisor, and a reconnect after the server
// restarts on the same port, with a hello that lists the running job and the exits produced
// while disconnected delivered afterwards.
#include "worker/agent/session_client.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/fake_node_service.h"
#include "worker/agent/node_identity.h"
#include "worker/agent/supervisor.h"

namespace loom::worker {
namespace {

using ::testing::ElementsAre;
using testing::CountKind;
using testing::FakeServer;
using testing::FindStatus;

v1::Assignment SleepJob(const std::string& name) {
  v1::Assignment a;
  a.set_job("jobs/" + name);
  a.set_generation(1);
  a.set_world_size(1);
  a.set_num_nodes(1);
  a.mutable_layout()->set_data(1);
  a.mutable_layout()->set_tensor(1);
  a.mutable_layout()->set_pipeline(1);
  v1::RankAssignment* r = a.add_ranks();
  r->set_device_kind(v1::DEVICE_KIND_CPU);
  r->set_device_index(name == "first" ? 0 : 1);
  return a;
}

TEST(SessionClientTest, RegistersRunsAssignmentsAndReconnects) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "loom-session-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;

  auto server1 = std::make_unique<FakeServer>();
  ASSERT_TRUE(server1->Start(0));
  const int port = server1->port;

  OutboundBuffer buffer;
  SupervisorOptions sup;
  sup.work_dir = dir;
  sup.rank_program = "/bin/sh";
  sup.rank_args = {"-c", "echo hello from $LOOM_JOB; exec sleep 60"};
  sup.stop_grace = absl::Seconds(2);
  sup.devices = CpuDevices(2);
  sup.log_flush_interval = absl::Milliseconds(20);
  Supervisor supervisor(sup, &buffer);
  ASSERT_TRUE(supervisor.Start().ok());

  SessionOptions options;
  options.coordinator = absl::StrCat("127.0.0.1:", port);
  options.registration.set_node_id("test-node");
  for (const v1::Device& d : sup.devices) *options.registration.add_devices() = d;
  options.backoff_initial = absl::Milliseconds(20);
  options.backoff_max = absl::Milliseconds(200);
  SessionCallbacks callbacks;
  callbacks.running_jobs = [&] { return supervisor.RunningJobs(); };
  callbacks.on_assign = [&](v1::Assignment a) { supervisor.Assign(std::move(a)); };
  callbacks.on_cancel = [&](const v1::CancelAssignment& c) {
    supervisor.Cancel(c.job(), c.generation(), c.reason());
  };
  SessionClient session(options, &buffer, callbacks);
  session.Start();

  // Registers, says hello first (nothing running), then heartbeats at loomd's interval.
  ASSERT_TRUE(server1->service.WaitFor([](const auto& regs, const auto& received) {
    return !regs.empty() && CountKind(received, v1::WorkerMessage::kHeartbeat) >= 3;
  }));
  {
    const auto received = server1->service.Received();
    ASSERT_TRUE(received[0].has_hello());
    EXPECT_EQ(received[0].hello().node_id(), "test-node");
    EXPECT_EQ(received[0].hello().running_size(), 0);
  }
  EXPECT_TRUE(session.connected());
  EXPECT_EQ(session.heartbeat_interval(), absl::Milliseconds(100));

  // Two assignments down; both run, and their statuses and logs come up.
  for (const char* name : {"first", "second"}) {
    v1::CoordinatorMessage m;
    *m.mutable_assign() = SleepJob(name);
    server1->service.Send(m);
  }
  ASSERT_TRUE(server1->service.WaitFor([](const auto&, const auto& received) {
    int logs = 0;
    for (const auto& m : received) logs += m.has_logs();
    return FindStatus(received, "jobs/first", v1::RANK_PHASE_RUNNING) != nullptr &&
           FindStatus(received, "jobs/second", v1::RANK_PHASE_RUNNING) != nullptr && logs >= 2;
  }));
  for (const auto& m : server1->service.Received()) {
    if (m.has_logs() && m.logs().job() == "jobs/first") {
      EXPECT_THAT(m.logs().lines(), ElementsAre("hello from jobs/first"));
    }
  }

  // loomd goes away: ranks keep running; an exit produced meanwhile is buffered.
  server1->Stop();
  ASSERT_TRUE(server1->service.WaitFor([&](const auto&, const auto&) {
    return !session.connected();
  }));
  supervisor.Cancel("jobs/second", 1, "while loomd is away");
  absl::SleepFor(absl::Milliseconds(300));  // several failed reconnects
  EXPECT_EQ(supervisor.RunningJobs().size(), 1u);

  // loomd comes back on the same port: register, hello with the running job, then the exit.
  auto server2 = std::make_unique<FakeServer>();
  ASSERT_TRUE(server2->Start(port));
  ASSERT_TRUE(server2->service.WaitFor([](const auto& regs, const auto& received) {
    return !regs.empty() &&
           FindStatus(received, "jobs/second", v1::RANK_PHASE_EXITED) != nullptr;
  }));
  {
    const auto received = server2->service.Received();
    ASSERT_TRUE(received[0].has_hello());
    ASSERT_EQ(received[0].hello().running_size(), 1);
    EXPECT_EQ(received[0].hello().running(0).job(), "jobs/first");
    EXPECT_EQ(received[0].hello().running(0).generation(), 1);
    EXPECT_THAT(received[0].hello().running(0).ranks(), ElementsAre(0));
    const v1::RankStatus* exit = FindStatus(received, "jobs/second", v1::RANK_PHASE_EXITED);
    EXPECT_EQ(exit->exit_class(), v1::EXIT_CLASS_STOPPED);
  }
  EXPECT_EQ(session.registrations(), 2);

  // A cancel on the new session stops the job that survived the outage.
  v1::CoordinatorMessage cancel;
  cancel.mutable_cancel()->set_job("jobs/first");
  cancel.mutable_cancel()->set_generation(1);
  cancel.mutable_cancel()->set_reason("user");
  server2->service.Send(cancel);
  ASSERT_TRUE(server2->service.WaitFor([](const auto&, const auto& received) {
    return FindStatus(received, "jobs/first", v1::RANK_PHASE_EXITED) != nullptr;
  }));
  EXPECT_EQ(supervisor.stats().launches, 2);  // nothing was launched twice

  supervisor.Shutdown();
  session.Stop(absl::Seconds(2));
  server2->Stop();
  std::filesystem::remove_all(dir);
}

v1::RankStatus Status(int rank, v1::RankPhase phase) {
  v1::RankStatus s;
  s.set_job("jobs/burst");
  s.set_generation(1);
  s.set_rank(rank);
  s.set_phase(phase);
  return s;
}

std::vector<v1::RankStatus> Statuses(v1::RankPhase phase) {
  std::vector<v1::RankStatus> statuses;
  for (int rank = 0; rank < 4; ++rank) statuses.push_back(Status(rank, phase));
  return statuses;
}

// "R0 R1 | logs | ..." for the messages after hello, heartbeats left out: a batch is the ranks
// of its statuses joined by spaces, a single status "rank N", with R or X for the phase.
std::string Shape(const std::vector<v1::WorkerMessage>& received) {
  auto name = [](const v1::RankStatus& s) {
    return absl::StrCat(s.phase() == v1::RANK_PHASE_EXITED ? "X" : "R", s.rank());
  };
  std::vector<std::string> parts;
  for (const v1::WorkerMessage& m : received) {
    if (m.has_rank_status()) parts.push_back("rank " + name(m.rank_status()));
    if (m.has_logs()) parts.push_back("logs");
    if (m.has_rank_statuses()) {
      std::vector<std::string> names;
      for (const v1::RankStatus& s : m.rank_statuses().statuses()) names.push_back(name(s));
      parts.push_back(absl::StrJoin(names, " "));
    }
  }
  return absl::StrJoin(parts, " | ");
}

int CountStatuses(const std::vector<v1::WorkerMessage>& received) {
  int n = 0;
  for (const v1::WorkerMessage& m : received) {
    n += m.has_rank_status() + m.rank_statuses().statuses_size();
  }
  return n;
}

TEST(SessionClientTest, SendsABurstOfStatusesAsOneMessageOnlyToALoomdThatReadsThem) {
  for (const bool batches : {true, false}) {
    SCOPED_TRACE(batches ? "loomd reads batches" : "an older loomd");
    auto server = std::make_unique<FakeServer>();
    server->service.accept_batches.store(batches);
    ASSERT_TRUE(server->Start(0));
    const int port = server->port;

    // Queued before the session opens: a gang's start, its logs, its end.
    OutboundBuffer buffer;
    buffer.OnRankStatuses(Statuses(v1::RANK_PHASE_RUNNING));
    v1::LogChunk logs;
    logs.set_job("jobs/burst");
    logs.add_lines("hello");
    buffer.OnLogChunk(logs);
    buffer.OnRankStatuses(Statuses(v1::RANK_PHASE_EXITED));

    SessionOptions options;
    options.coordinator = absl::StrCat("127.0.0.1:", port);
    options.registration.set_node_id("burst-node");
    options.backoff_initial = absl::Milliseconds(20);
    options.backoff_max = absl::Milliseconds(100);
    SessionClient session(options, &buffer, {});
    session.Start();
    ASSERT_TRUE(server->service.WaitFor(
        [](const auto&, const auto& received) { return CountStatuses(received) == 8; }));
    EXPECT_EQ(Shape(server->service.Received()),
              batches ? "R0 R1 R2 R3 | logs | X0 X1 X2 X3"
                      : "rank R0 | rank R1 | rank R2 | rank R3 | logs | rank X0 | rank X1 | "
                        "rank X2 | rank X3");
    EXPECT_TRUE(buffer.WaitDrained(absl::Now() + absl::Seconds(5)));

    // loomd restarts, now reading batches: the exits written on the old stream are sent again
    // (they may not have been read), together.
    server->Stop();
    ASSERT_TRUE(
        server->service.WaitFor([&](const auto&, const auto&) { return !session.connected(); }));
    auto again = std::make_unique<FakeServer>();
    again->service.accept_batches.store(true);
    ASSERT_TRUE(again->Start(port));
    ASSERT_TRUE(again->service.WaitFor(
        [](const auto&, const auto& received) { return CountStatuses(received) == 4; }));
    EXPECT_EQ(Shape(again->service.Received()), "X0 X1 X2 X3");
    session.Stop(absl::Seconds(2));
    again->Stop();
  }
}

TEST(SessionClientTest, KeepsRetryingWhileLoomdIsDown) {
  OutboundBuffer buffer;
  SessionOptions options;
  options.coordinator = "127.0.0.1:1";  // nothing listens there
  options.registration.set_node_id("lonely");
  options.backoff_initial = absl::Milliseconds(10);
  options.backoff_max = absl::Milliseconds(50);
  SessionClient session(options, &buffer, {});
  session.Start();
  v1::RankStatus s;
  s.set_phase(v1::RANK_PHASE_EXITED);
  buffer.OnRankStatus(s);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(session.connected());
  EXPECT_EQ(session.registrations(), 0);
  EXPECT_EQ(buffer.size(), 1u);  // kept for when loomd returns
  const absl::Time start = absl::Now();
  session.Stop(absl::Seconds(5));  // not connected: no flush wait
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

}  // namespace
}  // namespace loom::worker
