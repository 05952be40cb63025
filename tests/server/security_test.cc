// loomd with security on, in process on a loopback port: TLS (certificates from
// scripts/dev-certs.sh), bearer tokens and client certificates mapped to tenants and roles.
// What a hostile client tries: calling without credentials or in plaintext, reading, listing,
// watching, cancelling another tenant's job or its env, reusing its request_id, posing as a
// worker, taking over a live node's id; and what an operator needs: refusal of plaintext off
// loopback, token rotation without a restart.
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/wire_client.h"
#include "common/clock.h"
#include "common/tls.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "loom/v1/job.grpc.pb.h"
#include "loom/v1/node.grpc.pb.h"
#include "loom/v1/scaling.grpc.pb.h"
#include "server/jobs/default_spec_validator.h"
#include "server/rpc/call_auth.h"
#include "server/rpc/loomd_server.h"
#include "tests/server/loomd_test_util.h"
#include "tests/server/store_test_util.h"

namespace loom::rpc {
namespace {

using ::loom::testing::CpuNode;
using ::loom::testing::CpuSpec;
using ::loom::testing::CreateRequest;
using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Replaces `path` atomically (as an operator rotating tokens should), mode 600.
void WriteTokens(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".new";
  {
    std::ofstream out(tmp);
    out << text;
  }
  std::filesystem::permissions(
      tmp, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  std::filesystem::rename(tmp, path);
}

class SecurityTest : public ::testing::Test {
 protected:
  static constexpr char kTeamBToken[] = "team-b-token-0123456789abcdef";
  static constexpr char kNodeN2Token[] = "node-n2-only-token-0123456789";

  void SetUp() override {
    certs_ = dir_.File("certs");
    const std::string cmd =
        absl::StrCat("LOOM_DEV_CLIENTS='node:n1 user:team-c' bash ", LOOM_SOURCE_DIR,
                     "/scripts/dev-certs.sh ", certs_, " >/dev/null");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    user_token_ = ReadLine(certs_ + "/user.token");
    admin_token_ = ReadLine(certs_ + "/admin.token");
    node_token_ = ReadLine(certs_ + "/node.token");
    base_tokens_ = absl::StrCat("user dev ", user_token_, "\nadmin ops ", admin_token_, "\nnode * ",
                                node_token_, "\n");
    WriteTokens(certs_ + "/tokens", absl::StrCat(base_tokens_, "user team-b ", kTeamBToken,
                                                 "\nnode n2 ", kNodeN2Token, "\n"));
    ASSERT_NO_FATAL_FAILURE(StartLoomd());
  }

  LoomdConfig SecureConfig() {
    LoomdConfig config;
    config.listen = "127.0.0.1:0";
    config.metrics_listen = "";
    config.state_dir = dir_.File("state");
    config.tls = {certs_ + "/loomd.pem", certs_ + "/loomd.key", certs_ + "/ca.pem"};
    config.tokens_file = certs_ + "/tokens";
    return config;
  }

  void StartLoomd() {
    absl::StatusOr<std::unique_ptr<LoomdServer>> server =
        LoomdServer::Start(SecureConfig(), &clock_, jobs::MakeSpecValidator());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  // A TLS channel verifying loomd against the dev CA, presenting the client certificate
  // `client` (e.g. "node-n1") when given.
  std::shared_ptr<grpc::Channel> Channel(const std::string& client = "") {
    TlsFiles files{"", "", certs_ + "/ca.pem"};
    if (!client.empty()) {
      files.cert = certs_ + "/" + client + ".pem";
      files.key = certs_ + "/" + client + ".key";
    }
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
        MakeChannelCredentials(files, false, server_->grpc_address(), "--tls");
    EXPECT_TRUE(creds.ok()) << creds.status();
    return grpc::CreateChannel(server_->grpc_address(), *creds);
  }

  // A context with a deadline and, when given, the bearer token.
  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }

  grpc::Status Create(const std::string& token, const v1::CreateJobRequest& request, v1::Job* job) {
    return v1::JobService::NewStub(Channel())->CreateJob(Ctx(token).get(), request, job);
  }
  grpc::Status Get(const std::string& token, const std::string& name, v1::Job* job) {
    v1::GetJobRequest request;
    request.set_name(name);
    return v1::JobService::NewStub(Channel())->GetJob(Ctx(token).get(), request, job);
  }
  std::vector<std::string> List(const std::string& token, const std::string& client = "") {
    v1::ListJobsResponse response;
    grpc::Status status =
        v1::JobService::NewStub(Channel(client))->ListJobs(Ctx(token).get(), {}, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::vector<std::string> names;
    for (const v1::Job& job : response.jobs()) names.push_back(job.name());
    return names;
  }
  grpc::Status Register(const std::string& token, const std::string& node_id,
                        const std::string& client = "") {
    v1::RegisterNodeResponse response;
    return v1::NodeService::NewStub(Channel(client))
        ->RegisterNode(Ctx(token).get(), CpuNode(node_id, 2), &response);
  }

  store::testing::TempDir dir_;
  SystemClock clock_;
  std::string certs_, user_token_, admin_token_, node_token_, base_tokens_;
  std::unique_ptr<LoomdServer> server_;
};

TEST_F(SecurityTest, PlaintextIsRefusedOffLoopbackAndWithoutInsecure) {
  LoomdConfig config = SecureConfig();
  config.tls = {};
  config.tokens_file.clear();
  config.state_dir = dir_.File("other");
  absl::StatusOr<std::unique_ptr<LoomdServer>> s =
      LoomdServer::Start(config, &clock_, jobs::MakeSpecValidator());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
  EXPECT_THAT(s.status().message(), HasSubstr("--tls-cert"));
  EXPECT_THAT(s.status().message(), HasSubstr("dev-certs.sh"));

  config.insecure = true;
  config.listen = "0.0.0.0:0";
  s = LoomdServer::Start(config, &clock_, jobs::MakeSpecValidator());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("loopback"));

  // TLS with no way to tell callers apart is refused too.
  config = SecureConfig();
  config.state_dir = dir_.File("other");
  config.tokens_file.clear();
  config.tls.ca.clear();
  s = LoomdServer::Start(config, &clock_, jobs::MakeSpecValidator());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("--tokens-file"));
}

TEST_F(SecurityTest, CallsWithoutCredentialsOrInPlaintextGetNothing) {
  v1::ListJobsResponse response;
  grpc::Status status = v1::JobService::NewStub(Channel())->ListJobs(Ctx("").get(), {}, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  status = v1::JobService::NewStub(Channel())->ListJobs(Ctx("not-a-listed-token-0123456789").get(),
                                                        {}, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(), HasSubstr("unknown or revoked token"));
  // A plaintext client cannot even complete the handshake.
  auto plain = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
  status = v1::JobService::NewStub(plain)->ListJobs(Ctx(user_token_).get(), {}, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  // Nor can loomctl's wire client (plaintext only, client/wire_client.h), token or not: it gets
  // UNAVAILABLE rather than hanging or reaching the service.
  client::WireClient wire(server_->grpc_address(), user_token_);
  status = wire.Call("/loom.v1.JobService/ListJobs", v1::ListJobsRequest(), &response,
                     absl::Now() + absl::Seconds(10));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  // A node credential is not a person.
  status = v1::JobService::NewStub(Channel())->ListJobs(Ctx(node_token_).get(), {}, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

// loomctl decides plaintext or TLS before it makes any gRPC credentials (which would start
// gRPC's runtime); the decision and its errors are MakeChannelCredentials' own.
TEST_F(SecurityTest, ChannelIsPlaintextDecidesAsMakeChannelCredentialsDoes) {
  const std::string ca = certs_ + "/ca.pem";
  EXPECT_EQ(ChannelIsPlaintext({}, false, "127.0.0.1:7070", "--tls").value(), true);
  EXPECT_EQ(ChannelIsPlaintext({}, false, "localhost:7070", "--tls").value(), true);
  EXPECT_EQ(ChannelIsPlaintext({}, false, "loomd.example:7070", "--tls").value(), false);
  EXPECT_EQ(ChannelIsPlaintext({}, true, "loomd.example:7070", "--tls").value(), true);
  EXPECT_EQ(ChannelIsPlaintext({"", "", ca}, false, "127.0.0.1:7070", "--tls").value(), false);
  absl::StatusOr<bool> both = ChannelIsPlaintext({"", "", ca}, true, "127.0.0.1:1", "--tls");
  ASSERT_FALSE(both.ok());
  EXPECT_THAT(both.status().message(), HasSubstr("--insecure contradicts"));
  absl::StatusOr<bool> missing =
      ChannelIsPlaintext({"", "", certs_ + "/no.pem"}, false, "127.0.0.1:1", "--tls");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("--tls-ca"));
  EXPECT_FALSE(ChannelIsPlaintext({"c.pem", "", ""}, false, "127.0.0.1:1", "--tls").ok());
  EXPECT_FALSE(ChannelIsPlaintext({}, false, "no-port", "--tls").ok());
}

// TLS for a wire client that verifies the server with `ca` and presents no certificate.
client::WireTls WireCa(const std::string& ca) {
  client::WireTls tls;
  tls.ca = ca;
  return tls;
}

// loomctl's wire calls over TLS (client/wire_client.h) hold to what gRPC's TLS holds to: loomd
// is verified against the CA and by its name, the token or a client certificate says who calls,
// and a server another CA vouches for, or one under another name, gets nothing.
TEST_F(SecurityTest, TheWireClientOverTlsVerifiesLoomdAndCarriesItsCaller) {
  const std::string address = server_->grpc_address();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  ASSERT_TRUE(Register(node_token_, "n1").ok());  // capacity; no session, so the job stays QUEUED
  v1::Job job;
  ASSERT_TRUE(Create(user_token_, CreateRequest(CpuSpec(1), "wire-tls-1"), &job).ok());
  v1::ListJobsResponse response;

  client::WireClient with_token(address, user_token_, WireCa(certs_ + "/ca.pem"));
  grpc::Status s =
      with_token.Call("/loom.v1.JobService/ListJobs", v1::ListJobsRequest(), &response, deadline);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(response.jobs_size(), 1);
  EXPECT_EQ(response.jobs(0).name(), job.name());

  // A client certificate alone: team-c's identity, which sees none of dev's jobs.
  client::WireClient with_cert(address, "",
                               client::WireTls{certs_ + "/ca.pem", certs_ + "/user-team-c.pem",
                                               certs_ + "/user-team-c.key"});
  response.Clear();
  s = with_cert.Call("/loom.v1.JobService/ListJobs", v1::ListJobsRequest(), &response, deadline);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.jobs_size(), 0);

  // Neither: loomd refuses the call.
  client::WireClient nobody(address, "", WireCa(certs_ + "/ca.pem"));
  s = nobody.Call("/loom.v1.JobService/ListJobs", v1::ListJobsRequest(), &response, deadline);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();

  // Another CA: the handshake fails before the token is sent.
  const std::string other = dir_.File("other-certs");
  ASSERT_EQ(std::system(absl::StrCat("bash ", LOOM_SOURCE_DIR, "/scripts/dev-certs.sh ", other,
                                     " >/dev/null")
                            .c_str()),
            0);
  client::WireClient wrong_ca(address, user_token_, WireCa(other + "/ca.pem"));
  s = wrong_ca.Call("/loom.v1.JobService/ListJobs", v1::ListJobsRequest(), &response, deadline);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("not trusted"));

  // The right CA, but loomd reached under a name its certificate does not carry.
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  client::WireClient wrong_name(fd, "loomd.elsewhere.example:" + std::to_string(port), user_token_,
                                WireCa(certs_ + "/ca.pem"));
  s = wrong_name.Call("/loom.v1.JobService/ListJobs", v1::ListJobsRequest(), &response, deadline);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("not trusted"));

  // A CA file that cannot be used is the caller's to fix.
  client::WireClient no_ca(address, user_token_, WireCa(certs_ + "/missing.pem"));
  s = no_ca.Call("/loom.v1.JobService/ListJobs", v1::ListJobsRequest(), &response, deadline);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("--tls-ca"));
}

TEST_F(SecurityTest, TenantsCannotSeeOrTouchEachOthersJobs) {
  ASSERT_TRUE(Register(node_token_, "n1").ok());  // capacity; no session, so jobs stay QUEUED
  v1::JobSpec spec = CpuSpec(2);
  (*spec.mutable_env())["WANDB_API_KEY"] = "s3cret-of-dev";
  v1::Job mine;
  grpc::Status status = Create(user_token_, CreateRequest(spec, "req-1"), &mine);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(mine.tenant(), "dev");

  // The owner sees its env.
  v1::Job got;
  ASSERT_TRUE(Get(user_token_, mine.name(), &got).ok());
  EXPECT_EQ(got.spec().env().at("WANDB_API_KEY"), "s3cret-of-dev");

  // Another tenant: denied for get, watch, logs and cancel, and the job is not listed.
  status = Get(kTeamBToken, mine.name(), &got);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("another tenant"));
  EXPECT_THAT(List(kTeamBToken), ::testing::IsEmpty());
  {
    v1::CancelJobRequest request;
    request.set_name(mine.name());
    v1::Job cancelled;
    status =
        v1::JobService::NewStub(Channel())->CancelJob(Ctx(kTeamBToken).get(), request, &cancelled);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    v1::WatchJobRequest request;
    request.set_name(mine.name());
    auto ctx = Ctx(kTeamBToken);
    auto reader = v1::JobService::NewStub(Channel())->WatchJob(ctx.get(), request);
    v1::JobUpdate update;
    EXPECT_FALSE(reader->Read(&update));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    v1::StreamJobLogsRequest request;
    request.set_name(mine.name());
    auto ctx = Ctx(kTeamBToken);
    auto reader = v1::JobService::NewStub(Channel())->StreamJobLogs(ctx.get(), request);
    v1::LogLine line;
    EXPECT_FALSE(reader->Read(&line));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    // The doctor's report: the owner's (a QUEUED job: empty, with a note), not another tenant's.
    v1::GetJobReportRequest request;
    request.set_name(mine.name());
    v1::JobReport report;
    status =
        v1::JobService::NewStub(Channel())->GetJobReport(Ctx(kTeamBToken).get(), request, &report);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    status =
        v1::JobService::NewStub(Channel())->GetJobReport(Ctx(user_token_).get(), request, &report);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(report.job(), mine.name());
    EXPECT_THAT(report.note(), HasSubstr("QUEUED"));
  }
  {
    // The timeline: another tenant is denied before anything is fetched; the owner's QUEUED job
    // has none yet (FAILED_PRECONDITION naming the state).
    v1::GetJobTraceRequest request;
    request.set_name(mine.name());
    request.set_first_step(1);
    request.set_last_step(2);
    v1::JobTrace trace;
    status =
        v1::JobService::NewStub(Channel())->GetJobTrace(Ctx(kTeamBToken).get(), request, &trace);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    status =
        v1::JobService::NewStub(Channel())->GetJobTrace(Ctx(user_token_).get(), request, &trace);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(status.error_message(), HasSubstr("RUNNING"));
  }
  // The same request_id from another tenant is another job, not the first tenant's.
  v1::Job theirs;
  ASSERT_TRUE(Create(kTeamBToken, CreateRequest(CpuSpec(1), "req-1"), &theirs).ok());
  EXPECT_NE(theirs.name(), mine.name());
  EXPECT_EQ(theirs.tenant(), "team-b");
  EXPECT_THAT(List(kTeamBToken), ::testing::ElementsAre(theirs.name()));
  // A tenant authenticated by its client certificate sees neither.
  EXPECT_THAT(List("", "user-team-c"), ::testing::IsEmpty());

  // The admin sees both jobs, but never another tenant's env values.
  EXPECT_THAT(List(admin_token_), ::testing::ElementsAre(mine.name(), theirs.name()));
  ASSERT_TRUE(Get(admin_token_, mine.name(), &got).ok());
  EXPECT_EQ(got.spec().env().at("WANDB_API_KEY"), kHiddenEnvValue);

  // The owner's cancel works.
  v1::CancelJobRequest request;
  request.set_name(mine.name());
  v1::Job cancelled;
  status =
      v1::JobService::NewStub(Channel())->CancelJob(Ctx(user_token_).get(), request, &cancelled);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(cancelled.state(), v1::CANCELLED);
}

TEST_F(SecurityTest, OnlyANodeCredentialRegistersANode) {
  grpc::Status status = Register("", "n1");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  status = Register(user_token_, "n1");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("cannot pose as a worker"));
  status = Register(admin_token_, "n1");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // A token bound to n2 registers n2 only.
  status = Register(kNodeN2Token, "n1");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("--node-id=n2"));
  EXPECT_TRUE(Register(kNodeN2Token, "n2").ok());
  // The join token, and the certificate named node:n1.
  EXPECT_TRUE(Register(node_token_, "n3").ok());
  EXPECT_TRUE(Register("", "n1", "node-n1").ok());
  status = Register("", "n4", "node-n1");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);

  // Without a node credential, a session never receives anything.
  auto ctx = Ctx(user_token_);
  auto stream = v1::NodeService::NewStub(Channel())->Session(ctx.get());
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_node_id("n1");
  stream->Write(hello);
  stream->WritesDone();
  v1::CoordinatorMessage message;
  EXPECT_FALSE(stream->Read(&message));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(SecurityTest, ALiveNodeIdCannotBeTakenOver) {
  ASSERT_TRUE(Register(node_token_, "n1").ok());
  auto ctx = Ctx(node_token_);
  auto stub = v1::NodeService::NewStub(Channel());
  auto session = stub->Session(ctx.get());
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_node_id("n1");
  ASSERT_TRUE(session->Write(hello));
  // The session is open once loomd lists the node READY with its devices schedulable; wait
  // until a second registration is refused (the session is installed asynchronously).
  grpc::Status second;
  for (int i = 0; i < 100; ++i) {
    second = Register(node_token_, "n1");
    if (!second.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(second.error_code(), grpc::StatusCode::ALREADY_EXISTS) << second.error_message();
  EXPECT_THAT(second.error_message(), HasSubstr("is live"));
  // A second session with the same hello is refused as well, and the first one stays.
  {
    auto ctx2 = Ctx(node_token_);
    auto intruder = stub->Session(ctx2.get());
    intruder->Write(hello);
    intruder->WritesDone();
    v1::CoordinatorMessage message;
    EXPECT_FALSE(intruder->Read(&message));
    EXPECT_EQ(intruder->Finish().error_code(), grpc::StatusCode::ALREADY_EXISTS);
  }
  v1::WorkerMessage heartbeat;
  heartbeat.mutable_heartbeat();
  EXPECT_TRUE(session->Write(heartbeat));
  // Once the session ends, the id is free again (a restarted worker re-registers).
  session->WritesDone();
  session->Finish();
  grpc::Status again;
  for (int i = 0; i < 100; ++i) {
    again = Register(node_token_, "n1");
    if (again.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(again.ok()) << again.error_message();
}

TEST_F(SecurityTest, TokensAreAddedAndRevokedWithoutARestart) {
  const std::string new_token = "team-d-token-0123456789abcdef";
  v1::ListJobsResponse response;
  EXPECT_EQ(v1::JobService::NewStub(Channel())
                ->ListJobs(Ctx(new_token).get(), {}, &response)
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // team-b is revoked, team-d added; the file is re-read within about a second.
  WriteTokens(certs_ + "/tokens", absl::StrCat(base_tokens_, "user team-d ", new_token, "\n"));
  grpc::StatusCode added = grpc::StatusCode::UNKNOWN, revoked = grpc::StatusCode::UNKNOWN;
  for (int i = 0; i < 60; ++i) {
    added = v1::JobService::NewStub(Channel())
                ->ListJobs(Ctx(new_token).get(), {}, &response)
                .error_code();
    revoked = v1::JobService::NewStub(Channel())
                  ->ListJobs(Ctx(kTeamBToken).get(), {}, &response)
                  .error_code();
    if (added == grpc::StatusCode::OK && revoked == grpc::StatusCode::UNAUTHENTICATED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(added, grpc::StatusCode::OK);
  EXPECT_EQ(revoked, grpc::StatusCode::UNAUTHENTICATED);
  // A broken file keeps the last good tokens.
  WriteTokens(certs_ + "/tokens", "user team-e too-short\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  EXPECT_EQ(v1::JobService::NewStub(Channel())
                ->ListJobs(Ctx(new_token).get(), {}, &response)
                .error_code(),
            grpc::StatusCode::OK);
}

TEST_F(SecurityTest, ServingCertificateIsReloadedWithoutARestart) {
  // A second CA and a certificate from it; clients that trust only the new CA cannot connect
  // until loomd serves the new certificate, which it picks up from the same paths.
  const std::string next = dir_.File("next");
  ASSERT_EQ(std::system(absl::StrCat("bash ", LOOM_SOURCE_DIR, "/scripts/dev-certs.sh ", next,
                                     " >/dev/null")
                            .c_str()),
            0);
  auto list_trusting = [&](const std::string& ca) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
        MakeChannelCredentials({"", "", ca}, false, server_->grpc_address(), "--tls");
    EXPECT_TRUE(creds.ok());
    v1::ListJobsResponse response;
    return v1::JobService::NewStub(grpc::CreateChannel(server_->grpc_address(), *creds))
        ->ListJobs(Ctx(user_token_).get(), {}, &response)
        .error_code();
  };
  EXPECT_EQ(list_trusting(certs_ + "/ca.pem"), grpc::StatusCode::OK);
  EXPECT_EQ(list_trusting(next + "/ca.pem"), grpc::StatusCode::UNAVAILABLE);
  // Rotate: the key first, then the certificate, each by rename.
  for (const char* file : {"loomd.key", "loomd.pem"}) {
    std::filesystem::copy_file(absl::StrCat(next, "/", file),
                               absl::StrCat(certs_, "/", file, ".new"));
    std::filesystem::rename(absl::StrCat(certs_, "/", file, ".new"),
                            absl::StrCat(certs_, "/", file));
  }
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  for (int i = 0; i < 100 && code != grpc::StatusCode::OK; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    code = list_trusting(next + "/ca.pem");
  }
  EXPECT_EQ(code, grpc::StatusCode::OK) << "loomd still serves the old certificate after 10 s";
  EXPECT_EQ(list_trusting(certs_ + "/ca.pem"), grpc::StatusCode::UNAVAILABLE);
}

// Scaling sweeps (ScalingService) belong to a tenant exactly like jobs, and so do their copies.
TEST_F(SecurityTest, TenantsCannotSeeOrTouchEachOthersScaleTests) {
  ASSERT_TRUE(Register(node_token_, "n1").ok());  // capacity; no session, so copies stay QUEUED
  v1::CreateScaleTestRequest create;
  *create.mutable_spec() = CpuSpec(2);
  (*create.mutable_spec()->mutable_env())["WANDB_API_KEY"] = "s3cret-of-dev";
  create.add_devices(1);
  create.add_devices(2);
  auto stub = [&] { return v1::ScalingService::NewStub(Channel()); };
  v1::ScaleTest mine;
  grpc::Status status = stub()->CreateScaleTest(Ctx(user_token_).get(), create, &mine);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(mine.tenant(), "dev");
  EXPECT_EQ(mine.state(), v1::SCALE_TEST_RUNNING);
  ASSERT_EQ(mine.points_size(), 2);
  ASSERT_FALSE(mine.points(0).job().empty());  // the first copy, created at once
  EXPECT_TRUE(mine.points(1).job().empty());   // one size at a time
  v1::Job copy;
  ASSERT_TRUE(Get(user_token_, mine.points(0).job(), &copy).ok());
  EXPECT_EQ(copy.tenant(), "dev");
  EXPECT_EQ(copy.scale_test(), mine.name());

  v1::GetScaleTestRequest get;
  get.set_name(mine.name());
  v1::ScaleTest got;
  status = stub()->GetScaleTest(Ctx(kTeamBToken).get(), get, &got);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("another tenant"));
  v1::CancelScaleTestRequest cancel;
  cancel.set_name(mine.name());
  v1::ScaleTest cancelled;
  status = stub()->CancelScaleTest(Ctx(kTeamBToken).get(), cancel, &cancelled);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Get(kTeamBToken, mine.points(0).job(), &copy).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::ListScaleTestsResponse listed;
  ASSERT_TRUE(stub()->ListScaleTests(Ctx(kTeamBToken).get(), {}, &listed).ok());
  EXPECT_EQ(listed.scale_tests_size(), 0);
  ASSERT_TRUE(stub()->ListScaleTests(Ctx(user_token_).get(), {}, &listed).ok());
  EXPECT_EQ(listed.scale_tests_size(), 1);

  // The admin sees it without the env values.
  ASSERT_TRUE(stub()->GetScaleTest(Ctx(admin_token_).get(), get, &got).ok());
  EXPECT_EQ(got.spec().env().at("WANDB_API_KEY"), kHiddenEnvValue);

  // The owner cancels it, and its queued copy with it.
  status = stub()->CancelScaleTest(Ctx(user_token_).get(), cancel, &cancelled);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(cancelled.state(), v1::SCALE_TEST_CANCELLED);
  ASSERT_TRUE(Get(user_token_, mine.points(0).job(), &copy).ok());
  EXPECT_EQ(copy.state(), v1::CANCELLED);
}

// A scale test's request_id is its tenant's: a retry gets the sweep back; another request under
// the same id gets an error that names nothing of the sweep; another tenant's same id is its own
// sweep; and "/" (the tenant separator of the key) is refused.
TEST_F(SecurityTest, AScaleTestsRequestIdFindsOnlyTheSameRequestOfTheSameTenant) {
  ASSERT_TRUE(Register(node_token_, "n1").ok());
  v1::CreateScaleTestRequest create;
  *create.mutable_spec() = CpuSpec(2);
  create.add_devices(1);
  create.add_devices(2);
  create.set_request_id("sweep-1");
  auto stub = [&] { return v1::ScalingService::NewStub(Channel()); };
  v1::ScaleTest mine, again, theirs;
  ASSERT_TRUE(stub()->CreateScaleTest(Ctx(user_token_).get(), create, &mine).ok());
  grpc::Status status = stub()->CreateScaleTest(Ctx(user_token_).get(), create, &again);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(again.name(), mine.name());

  v1::CreateScaleTestRequest other = create;
  other.set_weak(true);
  status = stub()->CreateScaleTest(Ctx(user_token_).get(), other, &again);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(status.error_message(), HasSubstr("another scale test"));
  EXPECT_THAT(status.error_message(), Not(HasSubstr(mine.name())));

  ASSERT_TRUE(stub()->CreateScaleTest(Ctx(kTeamBToken).get(), create, &theirs).ok());
  EXPECT_NE(theirs.name(), mine.name());
  EXPECT_EQ(theirs.tenant(), "team-b");

  create.set_request_id("team-b/sweep-1");
  status = stub()->CreateScaleTest(Ctx(user_token_).get(), create, &again);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("request_id must not contain '/'"));
}

}  // namespace
}  // namespace loom::rpc
