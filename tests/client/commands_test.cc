// loomctl commands against an in-process fake loomd (client/commands.h): what is sent, what
// is printed, and the exit codes.
#include "client/commands.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/connection.h"
#include "common/spec_yaml.h"
#include "loom/v1/job.grpc.pb.h"
#include "loom/v1/node.grpc.pb.h"

namespace loom::client {
namespace {

using loom::v1::Job;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

// One scripted WatchJob call: updates to send, then the status to end with.
struct WatchScript {
  std::vector<Job> updates;
  grpc::Status end = grpc::Status::OK;
};

class FakeJobs final : public loom::v1::JobService::Service {
 public:
  grpc::Status CreateJob(grpc::ServerContext*, const loom::v1::CreateJobRequest* request,
                         Job* response) override {
    std::lock_guard<std::mutex> lock(mu);
    sent.push_back(*request);
    if (before_spec_yaml && !request->has_spec()) {  // what a loomd older than spec_yaml says
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "spec is required; give at least train.steps and resources (see "
                          "loomctl submit -f)");
    }
    // What loomd does with a spec sent as YAML (JobManager::CreateJob): the same reader, so
    // `creates` holds the request as if it had carried the spec.
    loom::v1::CreateJobRequest converted = *request;
    if (request->has_spec_yaml()) {
      absl::StatusOr<loom::v1::JobSpec> spec = JobSpecFromYamlMessage(request->spec_yaml());
      if (!spec.ok()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            std::string(spec.status().message()));
      }
      converted.clear_spec_yaml();
      *converted.mutable_spec() = *std::move(spec);
    }
    creates.push_back(converted);
    if (!create_error.ok()) return create_error;
    if (name_by_spec) {
      if (request->spec().name() == "refused") {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no node has 99 devices");
      }
      response->set_name("jobs/" + request->spec().name());
      response->set_state(loom::v1::QUEUED);
      return grpc::Status::OK;
    }
    response->set_name("jobs/j1");
    response->set_state(loom::v1::QUEUED);
    return grpc::Status::OK;
  }
  grpc::Status GetJob(grpc::ServerContext*, const loom::v1::GetJobRequest* request,
                      Job* response) override {
    std::lock_guard<std::mutex> lock(mu);
    gets.push_back(request->name());
    if (request->name() != "jobs/j1") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "jobs/" + request->name() + " not found");
    }
    *response = current;
    return grpc::Status::OK;
  }
  grpc::Status ListJobs(grpc::ServerContext*, const loom::v1::ListJobsRequest* request,
                        loom::v1::ListJobsResponse* response) override {
    std::lock_guard<std::mutex> lock(mu);
    lists.push_back(*request);
    // Two pages of one job each.
    Job* job = response->add_jobs();
    if (request->page_token().empty()) {
      job->set_name("jobs/a");
      response->set_next_page_token("page2");
    } else {
      job->set_name("jobs/b");
    }
    return grpc::Status::OK;
  }
  grpc::Status CancelJob(grpc::ServerContext*, const loom::v1::CancelJobRequest* request,
                         Job* response) override {
    response->set_name(request->name());
    response->set_state(loom::v1::CANCELLED);
    return grpc::Status::OK;
  }
  grpc::Status WatchJob(grpc::ServerContext*, const loom::v1::WatchJobRequest* request,
                        grpc::ServerWriter<loom::v1::JobUpdate>* writer) override {
    WatchScript script;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (watches.empty()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such job");
      script = watches.front();
      watches.pop_front();
    }
    for (const Job& job : script.updates) {
      loom::v1::JobUpdate update;
      *update.mutable_job() = job;
      writer->Write(update);
    }
    return script.end;
  }
  grpc::Status StreamJobLogs(grpc::ServerContext*, const loom::v1::StreamJobLogsRequest* request,
                             grpc::ServerWriter<loom::v1::LogLine>* writer) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      log_requests.push_back(*request);
    }
    for (int rank = 0; rank < 2; ++rank) {
      loom::v1::LogLine line;
      line.set_rank(rank);
      line.set_generation(1);
      line.set_stream("stdout");
      line.set_text("hello " + std::to_string(rank));
      writer->Write(line);
    }
    return grpc::Status::OK;
  }

  grpc::Status GetJobReport(grpc::ServerContext*, const loom::v1::GetJobReportRequest* request,
                            loom::v1::JobReport* response) override {
    if (request->name() != "jobs/j1") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, request->name() + " not found");
    }
    *response = report;
    return grpc::Status::OK;
  }

  std::mutex mu;
  grpc::Status create_error = grpc::Status::OK;
  loom::v1::JobReport report;
  bool before_spec_yaml = false;  // plays a loomd that ignores CreateJobRequest.spec_yaml
  std::vector<loom::v1::CreateJobRequest> sent;     // as received
  std::vector<loom::v1::CreateJobRequest> creates;  // with spec_yaml converted to spec
  // Name each job after its spec ("jobs/{spec.name}"), and refuse the spec named "refused".
  bool name_by_spec = false;
  std::vector<std::string> gets;
  std::vector<loom::v1::ListJobsRequest> lists;
  std::vector<loom::v1::StreamJobLogsRequest> log_requests;
  std::deque<WatchScript> watches;
  Job current;
};

class FakeNodes final : public loom::v1::NodeService::Service {
 public:
  grpc::Status ListNodes(grpc::ServerContext*, const loom::v1::ListNodesRequest*,
                         loom::v1::ListNodesResponse* response) override {
    auto* node = response->add_nodes();
    node->set_name("nodes/w0");
    node->set_state(loom::v1::NODE_STATE_READY);
    return grpc::Status::OK;
  }
  grpc::Status DrainNode(grpc::ServerContext*, const loom::v1::DrainNodeRequest* request,
                         loom::v1::Node* response) override {
    drains.push_back(*request);
    response->set_name(request->name());
    response->set_state(loom::v1::NODE_STATE_READY);
    response->set_draining(request->drain());
    return grpc::Status::OK;
  }
  grpc::Status DeleteNode(grpc::ServerContext*, const loom::v1::DeleteNodeRequest* request,
                          loom::v1::DeleteNodeResponse*) override {
    deletes.push_back(*request);
    if (!request->force()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          request->name() + " is READY and runs 1 gangs; pass --force");
    }
    return grpc::Status::OK;
  }
  std::vector<loom::v1::DrainNodeRequest> drains;
  std::vector<loom::v1::DeleteNodeRequest> deletes;
};

Job MakeJob(loom::v1::JobState state, int64_t step) {
  Job job;
  job.set_name("jobs/j1");
  job.set_state(state);
  job.mutable_progress()->set_step(step);
  job.mutable_progress()->set_total_steps(10);
  job.mutable_progress()->set_loss(2.0);
  if (state == loom::v1::FAILED) job.set_state_reason("rank 1 exited with code 3");
  return job;
}

// The commands over a plaintext connection, which makes every call on the wire
// (client/wire_client.h), against a real gRPC server.
class CommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&jobs_);
    builder.RegisterService(&nodes_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    connection_ =
        std::make_unique<Connection>("127.0.0.1:" + std::to_string(port), absl::Seconds(5), "");
    ctx_.connection = connection_.get();
    ctx_.out = &out_;
    ctx_.err = &err_;
    ctx_.follow.retry_initial = absl::Milliseconds(1);
    ctx_.follow.reconnect_window = absl::Seconds(5);
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("commands_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    // The connection first: an idle wire connection does not answer the server's shutdown PING,
    // and gRPC's graceful shutdown would wait 20 s for it (client/wire_client.h).
    ctx_.connection = nullptr;
    connection_.reset();
    server_->Shutdown();
    std::filesystem::remove_all(dir_);
  }

  std::string WriteSpec(const std::string& yaml, const std::string& file = "job.yaml") {
    const std::string path = (dir_ / file).string();
    std::ofstream(path) << yaml;
    return path;
  }

  FakeJobs jobs_;
  FakeNodes nodes_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Connection> connection_;
  std::ostringstream out_, err_;
  CommandContext ctx_;
  std::filesystem::path dir_;
};

// `loomctl doctor JOB`: the findings with their fix, gain and evidence, per stage and per rank;
// -o json is the JobReport; an unknown job is the server's NOT_FOUND.
TEST_F(CommandsTest, DoctorPrintsTheFindings) {
  loom::v1::JobReport& r = jobs_.report;
  r.set_job("jobs/j1");
  r.set_generation(1);
  r.set_windows(5);
  r.set_step_seconds(0.25);
  loom::v1::Finding* f = r.add_findings();
  f->set_kind(loom::v1::STAGE_IMBALANCE);
  f->set_severity(loom::v1::FINDING_SEVERITY_CRITICAL);
  f->set_subject("stage 3");
  f->set_summary("pipeline stage 3 is the bottleneck");
  f->set_fix("set parallelism.blocks_per_stage: [3, 2, 2, 1]");
  f->set_predicted_gain(0.2);
  auto* e = f->add_evidence();
  e->set_name("imbalance_ratio");
  e->set_value(1.8);
  e->set_series("loom_job_stage_imbalance_ratio");
  loom::v1::StageReport* st = r.add_stages();
  st->set_stage(0);
  st->set_blocks(2);
  st->set_idle_ratio(0.4);
  r.add_stages()->set_stage(1);
  loom::v1::RankReport* rank = r.add_ranks();
  rank->set_rank(0);
  rank->set_node("nodes/w0");
  rank->set_straggler_score(1.0);

  EXPECT_EQ(RunDoctor(ctx_, "j1"), 0) << err_.str();
  const std::string table = out_.str();
  for (const char* part : {"STAGE_IMBALANCE", "CRITICAL", "stage 3", "gain -20%",
                           "fix: set parallelism.blocks_per_stage: [3, 2, 2, 1]", "imbalance_ratio",
                           "(loom_job_stage_imbalance_ratio)", "STAGE  BLOCKS", "nodes/w0"}) {
    EXPECT_NE(table.find(part), std::string::npos) << part << " in\n" << table;
  }

  out_.str("");
  ctx_.format = OutputFormat::kJson;
  EXPECT_EQ(RunDoctor(ctx_, "jobs/j1"), 0);
  EXPECT_NE(out_.str().find("\"kind\": \"STAGE_IMBALANCE\""), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("\"blocksPerStage\""), std::string::npos);

  ctx_.format = OutputFormat::kTable;
  out_.str("");
  r.Clear();
  r.set_job("jobs/j1");
  r.set_note("waiting for steps");
  EXPECT_EQ(RunDoctor(ctx_, "j1"), 0);
  EXPECT_NE(out_.str().find("Note:      waiting for steps"), std::string::npos) << out_.str();

  EXPECT_NE(RunDoctor(ctx_, "other"), 0);  // the server's NOT_FOUND
  EXPECT_NE(err_.str().find("not found"), std::string::npos) << err_.str();
}

TEST_F(CommandsTest, SubmitSendsTheSpecAndAFreshRequestId) {
  const std::string file = WriteSpec("resources: {cpu_devices: 2}\ndata: {path: t.bin}\n");
  EXPECT_EQ(RunSubmit(ctx_, {.files = {file}}), 0);
  EXPECT_EQ(RunSubmit(ctx_, {.files = {file}}), 0);
  EXPECT_EQ(RunSubmit(ctx_, {.files = {file}, .request_id = "mine"}), 0);
  EXPECT_EQ(out_.str(), "jobs/j1\njobs/j1\njobs/j1\n");
  ASSERT_EQ(jobs_.creates.size(), 3u);
  EXPECT_THAT(jobs_.creates[0].request_id(), MatchesRegex("[0-9a-f]{32}"));
  EXPECT_NE(jobs_.creates[0].request_id(), jobs_.creates[1].request_id());
  EXPECT_EQ(jobs_.creates[2].request_id(), "mine");
  EXPECT_EQ(jobs_.creates[0].spec().resources().cpu_devices(), 2);
  EXPECT_EQ(jobs_.creates[0].spec().data().path(), (dir_ / "t.bin").string());
  // One file travels as its text, its name and its directory; loomd parses it.
  ASSERT_EQ(jobs_.sent.size(), 3u);
  EXPECT_FALSE(jobs_.sent[0].has_spec());
  EXPECT_EQ(jobs_.sent[0].spec_yaml().text(), "resources: {cpu_devices: 2}\ndata: {path: t.bin}\n");
  EXPECT_EQ(jobs_.sent[0].spec_yaml().source(), file);
  EXPECT_EQ(jobs_.sent[0].spec_yaml().base_dir(), dir_.string());
}

// A sweep: every file is a job, created over the one connection, printed in the order of the
// files; --request-id gives the i-th file ID-i, so the same command again gets the same jobs.
TEST_F(CommandsTest, SubmitOfSeveralSpecsCreatesAJobEachInTheirOrder) {
  jobs_.name_by_spec = true;
  std::vector<std::string> files;
  for (int i = 0; i < 20; ++i) {
    files.push_back(WriteSpec(absl::StrCat("name: s", i, "\ndata: {path: t.bin}\n"),
                              absl::StrCat("s", i, ".yaml")));
  }
  EXPECT_EQ(RunSubmit(ctx_, {.files = files, .request_id = "sweep"}), 0) << err_.str();
  std::string expected;
  for (int i = 0; i < 20; ++i) absl::StrAppend(&expected, "jobs/s", i, "\n");
  EXPECT_EQ(out_.str(), expected);
  ASSERT_EQ(jobs_.creates.size(), 20u);
  std::map<std::string, std::string> id_of;  // spec name -> request id
  for (const auto& c : jobs_.creates) id_of[c.spec().name()] = c.request_id();
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(id_of[absl::StrCat("s", i)], absl::StrCat("sweep-", i + 1));
  }
  EXPECT_EQ(jobs_.creates[0].spec().data().path(), (dir_ / "t.bin").string());

  out_.str("");
  ctx_.format = OutputFormat::kJson;
  EXPECT_EQ(RunSubmit(ctx_, {.files = {files[0], files[1]}}), 0);
  EXPECT_THAT(out_.str(), HasSubstr("\"jobs\""));
  EXPECT_LT(out_.str().find("jobs/s0"), out_.str().find("jobs/s1"));
  EXPECT_THAT(jobs_.creates.back().request_id(), MatchesRegex("[0-9a-f]{32}"));
}

// One bad spec: nothing is sent at all. A job the server refuses: the others are created, the
// refusal names its file, and the exit code is the refusal's. --wait and stdin are for one spec.
TEST_F(CommandsTest, ASweepSendsNothingWhenASpecIsBadAndReportsRefusalsByFile) {
  jobs_.name_by_spec = true;
  const std::string good = WriteSpec("name: good\n", "good.yaml");
  const std::string bad = WriteSpec("name: [\n", "bad.yaml");
  EXPECT_EQ(RunSubmit(ctx_, {.files = {good, bad}}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("bad.yaml:"));
  EXPECT_THAT(err_.str(), HasSubstr("nothing was submitted"));
  EXPECT_TRUE(jobs_.creates.empty());

  err_.str("");
  const std::string refused = WriteSpec("name: refused\n", "refused.yaml");
  EXPECT_EQ(RunSubmit(ctx_, {.files = {good, refused}}), 2);
  EXPECT_EQ(out_.str(), "jobs/good\n");
  EXPECT_THAT(err_.str(), HasSubstr("no node has 99 devices (" + refused + ")"));
  EXPECT_EQ(jobs_.creates.size(), 2u);

  err_.str("");
  EXPECT_EQ(RunSubmit(ctx_, {.files = {good, good}, .wait = true}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--wait follows one job"));
  EXPECT_EQ(RunSubmit(ctx_, {.files = {good, "-"}}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("standard input"));
  EXPECT_EQ(RunSubmit(ctx_, {}), 2);  // no spec at all
  EXPECT_THAT(err_.str(), HasSubstr("-f FILE"));
  EXPECT_EQ(jobs_.creates.size(), 2u);
}

// A loomd older than spec_yaml finds no spec in the request: loomctl parses the file itself and
// sends the spec, under the same request_id; a bad file is then refused by loomctl's own parse.
TEST_F(CommandsTest, AnOlderLoomdGetsTheParsedSpec) {
  jobs_.before_spec_yaml = true;
  const std::string file = WriteSpec("resources: {cpu_devices: 2}\ndata: {path: t.bin}\n");
  EXPECT_EQ(RunSubmit(ctx_, {.files = {file}, .request_id = "r1"}), 0) << err_.str();
  EXPECT_EQ(out_.str(), "jobs/j1\n");
  ASSERT_EQ(jobs_.sent.size(), 2u);
  EXPECT_TRUE(jobs_.sent[0].has_spec_yaml());
  EXPECT_FALSE(jobs_.sent[1].has_spec_yaml());
  EXPECT_EQ(jobs_.sent[1].spec().resources().cpu_devices(), 2);
  EXPECT_EQ(jobs_.sent[1].spec().data().path(), (dir_ / "t.bin").string());
  EXPECT_EQ(jobs_.sent[1].request_id(), "r1");

  EXPECT_EQ(RunSubmit(ctx_, {.files = {WriteSpec("resources: {cpu_devices: 2\n")}}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("job.yaml:2:1: YAML syntax error"));
  EXPECT_EQ(jobs_.sent.size(), 3u);
}

// loomd's answer to a bad file names the file, line and column, as loomctl's own parse did.
TEST_F(CommandsTest, BadYamlIsExit2NamingTheLineAndNoJobIsCreated) {
  const std::string file = WriteSpec("resources: {cpu_devices: 2\n");
  EXPECT_EQ(RunSubmit(ctx_, {.files = {file}}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("job.yaml:2:1: YAML syntax error"));
  EXPECT_TRUE(jobs_.creates.empty());
}

// A file that cannot be read, or is far too large to be a spec, is refused before anything is
// sent.
TEST_F(CommandsTest, UnreadableOrHugeSpecFileIsExit2AndNothingIsSent) {
  EXPECT_EQ(RunSubmit(ctx_, {.files = {(dir_ / "missing.yaml").string()}}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("cannot read job spec"));
  EXPECT_EQ(RunSubmit(ctx_, {.files = {"/dev/zero"}}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("/dev/zero: the job spec is over 1048576 bytes"));
  EXPECT_TRUE(jobs_.sent.empty());
}

TEST_F(CommandsTest, ServerRejectionIsExit2WithTheServersMessage) {
  jobs_.create_error = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                    "resources.cpu_devices: must be > 0; ask for at least one");
  EXPECT_EQ(RunSubmit(ctx_, {.files = {WriteSpec("name: x\n")}}), 2);
  EXPECT_EQ(err_.str(), "loomctl: resources.cpu_devices: must be > 0; ask for at least one\n");
}

TEST_F(CommandsTest, UnreachableServerIsExit3NamingTheAddress) {
  server_->Shutdown();
  Connection dead("127.0.0.1:1", absl::Seconds(5));
  ctx_.connection = &dead;
  EXPECT_EQ(RunNodes(ctx_), 3);
  EXPECT_THAT(err_.str(), HasSubstr("cannot reach loomd at 127.0.0.1:1"));
  EXPECT_EQ(RunWatch(ctx_, "j1"), 3);
}

TEST_F(CommandsTest, SubmitWaitFollowsToFailureAndExits1) {
  jobs_.watches.push_back({{MakeJob(loom::v1::RUNNING, 1), MakeJob(loom::v1::RUNNING, 2),
                            MakeJob(loom::v1::FAILED, 2)}});
  EXPECT_EQ(RunSubmit(ctx_, {.files = {WriteSpec("name: x\n")}, .wait = true}), 1);
  EXPECT_EQ(out_.str(),
            "jobs/j1\n"
            "jobs/j1 RUNNING  step 1/10 (10%)  loss 2.0000\n"
            "jobs/j1 RUNNING  step 2/10 (20%)  loss 2.0000\n"
            "jobs/j1 FAILED  step 2/10 (20%)  loss 2.0000\n"
            "jobs/j1 FAILED: rank 1 exited with code 3\n");
}

TEST_F(CommandsTest, WatchOnATerminalRedrawsInPlace) {
  ctx_.out_is_tty = true;
  jobs_.watches.push_back({{MakeJob(loom::v1::RUNNING, 1), MakeJob(loom::v1::SUCCEEDED, 10)}});
  EXPECT_EQ(RunWatch(ctx_, "jobs/j1"), 0);
  EXPECT_EQ(out_.str(),
            "\rjobs/j1 RUNNING  step 1/10 (10%)  loss 2.0000\x1b[K"
            "\rjobs/j1 SUCCEEDED  step 10/10 (100%)  loss 2.0000\x1b[K\n"
            "jobs/j1 SUCCEEDED (10 steps, final loss 2.0000)\n");
}

TEST_F(CommandsTest, WatchSurvivesABrokenStream) {
  jobs_.watches.push_back(
      {{MakeJob(loom::v1::RUNNING, 1)}, grpc::Status(grpc::StatusCode::UNAVAILABLE, "restart")});
  jobs_.watches.push_back({{MakeJob(loom::v1::CANCELLED, 3)}});
  jobs_.current = MakeJob(loom::v1::RUNNING, 2);
  EXPECT_EQ(RunWatch(ctx_, "j1"), 1);
  EXPECT_THAT(out_.str(), HasSubstr("jobs/j1 RUNNING  step 2/10"));  // from the GetJob
  EXPECT_THAT(out_.str(), HasSubstr("jobs/j1 CANCELLED"));
}

TEST_F(CommandsTest, WatchJsonKeepsStdoutOneDocument) {
  ctx_.format = OutputFormat::kJson;
  jobs_.watches.push_back({{MakeJob(loom::v1::RUNNING, 1), MakeJob(loom::v1::SUCCEEDED, 10)}});
  EXPECT_EQ(RunWatch(ctx_, "j1"), 0);
  const nlohmann::json j = nlohmann::json::parse(out_.str());
  EXPECT_EQ(j["state"], "SUCCEEDED");
  EXPECT_THAT(err_.str(), HasSubstr("jobs/j1 RUNNING  step 1/10"));
}

TEST_F(CommandsTest, GetUnknownJobIsExit2) {
  EXPECT_EQ(RunGet(ctx_, "nope", false), 2);
  EXPECT_THAT(err_.str(), HasSubstr("not found"));
  EXPECT_EQ(RunGet(ctx_, "nodes/x", false), 2);
  EXPECT_EQ(jobs_.gets.size(), 1u);  // the bad name never reached the server
}

TEST_F(CommandsTest, GetWaitExitsByTheFinalState) {
  jobs_.watches.push_back({{MakeJob(loom::v1::FAILED, 2)}});
  jobs_.current = MakeJob(loom::v1::FAILED, 2);
  EXPECT_EQ(RunGet(ctx_, "j1", true), 1);
  EXPECT_THAT(out_.str(), HasSubstr("State:       FAILED (rank 1 exited with code 3)"));
  jobs_.current = MakeJob(loom::v1::RUNNING, 2);
  EXPECT_EQ(RunGet(ctx_, "j1", false), 0);
}

TEST_F(CommandsTest, ListFollowsPagesAndFiltersByState) {
  EXPECT_EQ(RunList(ctx_, "running"), 0);
  ASSERT_EQ(jobs_.lists.size(), 2u);
  EXPECT_EQ(jobs_.lists[0].state(), loom::v1::RUNNING);
  EXPECT_EQ(jobs_.lists[1].page_token(), "page2");
  EXPECT_THAT(out_.str(), HasSubstr("jobs/a"));
  EXPECT_THAT(out_.str(), HasSubstr("jobs/b"));

  EXPECT_EQ(RunList(ctx_, "sleeping"), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--state: unknown job state 'sleeping'; use one of queued"));
}

TEST_F(CommandsTest, LogsPassRankAndPrintPerRank) {
  EXPECT_EQ(RunLogs(ctx_, {.job = "j1", .follow = true, .rank = 1}), 0);
  ASSERT_EQ(jobs_.log_requests.size(), 1u);
  EXPECT_TRUE(jobs_.log_requests[0].has_rank());
  EXPECT_EQ(jobs_.log_requests[0].rank(), 1);
  EXPECT_TRUE(jobs_.log_requests[0].follow());
  EXPECT_EQ(out_.str(), "[gen 1 rank 0] hello 0\n[gen 1 rank 1] hello 1\n");

  EXPECT_EQ(RunLogs(ctx_, {.job = "j1"}), 0);
  EXPECT_FALSE(jobs_.log_requests[1].has_rank());
  EXPECT_EQ(RunLogs(ctx_, {.job = "j1", .rank = -1}), 2);
}

TEST_F(CommandsTest, CancelAndNodes) {
  EXPECT_EQ(RunCancel(ctx_, "j1"), 0);
  EXPECT_EQ(out_.str(), "jobs/j1 CANCELLED\n");
  out_.str("");
  ctx_.format = OutputFormat::kJson;
  EXPECT_EQ(RunNodes(ctx_), 0);
  const nlohmann::json j = nlohmann::json::parse(out_.str());
  EXPECT_EQ(j["nodes"][0]["name"], "nodes/w0");
  EXPECT_EQ(j["nodes"][0]["state"], "NODE_STATE_READY");
}

TEST_F(CommandsTest, DrainAndDeleteNodes) {
  EXPECT_EQ(RunDrainNode(ctx_, {.node = "w0", .move_jobs = true}), 0);
  ASSERT_EQ(nodes_.drains.size(), 1u);
  EXPECT_EQ(nodes_.drains[0].name(), "nodes/w0");
  EXPECT_TRUE(nodes_.drains[0].move_jobs());
  EXPECT_TRUE(nodes_.drains[0].has_drain() && nodes_.drains[0].drain());
  EXPECT_THAT(out_.str(), HasSubstr("READY,draining"));
  EXPECT_EQ(RunDrainNode(ctx_, {.node = "nodes/w0", .undo = true}), 0);
  EXPECT_FALSE(nodes_.drains[1].drain());

  out_.str("");
  EXPECT_NE(RunDeleteNode(ctx_, "w0", /*force=*/false), 0);
  EXPECT_THAT(err_.str(), HasSubstr("pass --force"));
  EXPECT_EQ(RunDeleteNode(ctx_, "w0", /*force=*/true), 0);
  EXPECT_EQ(out_.str(), "nodes/w0 deleted\n");
  ASSERT_EQ(nodes_.deletes.size(), 2u);
  EXPECT_TRUE(nodes_.deletes[1].force());
}

}  // namespace
}  // namespace loom::client
