// WireClient against a real gRPC server (grpc::ServerBuilder on port 0), and against peers that
// are not gRPC servers at all: every answer gRPC can give arrives as gRPC's own client would see
// it, and nothing a peer sends crashes the client.
#include "client/wire_client.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "loom/v1/job.grpc.pb.h"

namespace loom::client {
namespace {

using ::testing::HasSubstr;

// A JobService that records what arrived and answers by the job name it is asked for.
class RecordingJobs : public loom::v1::JobService::Service {
 public:
  grpc::Status CreateJob(grpc::ServerContext* context, const loom::v1::CreateJobRequest* request,
                         loom::v1::Job* job) override {
    Record(context);
    job->set_name("jobs/" + request->spec().name());
    job->set_state(loom::v1::QUEUED);
    return grpc::Status::OK;
  }
  grpc::Status GetJob(grpc::ServerContext* context, const loom::v1::GetJobRequest* request,
                      loom::v1::Job* job) override {
    Record(context);
    if (request->name() == "jobs/slow") std::this_thread::sleep_for(std::chrono::seconds(2));
    if (request->name() == "jobs/odd-message") {
      // gRPC percent-encodes what is not printable ASCII, and '%' itself.
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "jobs/ünïcode: 100% gone\nsecond line");
    }
    if (request->name() == "jobs/missing") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "jobs/missing not found");
    }
    job->set_name(request->name());
    job->set_state(loom::v1::RUNNING);
    return grpc::Status::OK;
  }
  grpc::Status ListJobs(grpc::ServerContext* context, const loom::v1::ListJobsRequest* request,
                        loom::v1::ListJobsResponse* page) override {
    Record(context);
    // page_size jobs with long reasons: an answer of many HTTP/2 DATA frames.
    for (int i = 0; i < request->page_size(); ++i) {
      loom::v1::Job* job = page->add_jobs();
      job->set_name("jobs/j" + std::to_string(i));
      job->set_state_reason(std::string(200, 'r'));
    }
    return grpc::Status::OK;
  }

  // Log lines of 300 bytes each, numbered: `rank` of them and then OK, or with follow set, one
  // every millisecond until the client cancels (at most 10 s), or for the job "jobs/broken",
  // two lines and then DATA_LOSS.
  grpc::Status StreamJobLogs(grpc::ServerContext* context,
                             const loom::v1::StreamJobLogsRequest* request,
                             grpc::ServerWriter<loom::v1::LogLine>* writer) override {
    Record(context);
    const int count = request->follow()                  ? 10'000
                      : request->name() == "jobs/broken" ? 2
                                                         : request->rank();
    for (int i = 0; i < count; ++i) {
      if (context->IsCancelled()) {
        cancelled_.store(true);
        return grpc::Status::CANCELLED;
      }
      loom::v1::LogLine line;
      line.set_rank(i);
      line.set_text(std::to_string(i) + std::string(300, 'x'));
      if (!writer->Write(line)) {
        cancelled_.store(true);
        return grpc::Status::CANCELLED;
      }
      if (request->follow()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (request->name() == "jobs/broken") {
      return grpc::Status(grpc::StatusCode::DATA_LOSS, "the log file is gone");
    }
    return grpc::Status::OK;
  }
  bool cancelled() const { return cancelled_.load(); }

  struct Seen {
    std::string authorization;
    std::string user_agent;
    absl::Duration deadline_left;
    std::string peer;
  };
  std::vector<Seen> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

 private:
  void Record(grpc::ServerContext* context) {
    Seen s;
    for (const auto& [key, value] : context->client_metadata()) {
      if (key == "authorization") s.authorization = std::string(value.data(), value.size());
      if (key == "user-agent") s.user_agent = std::string(value.data(), value.size());
    }
    s.deadline_left = absl::FromChrono(context->deadline()) - absl::Now();
    s.peer = context->peer();
    absl::MutexLock lock(&mu_);
    seen_.push_back(s);
  }
  absl::Mutex mu_;
  std::vector<Seen> seen_;
  std::atomic<bool> cancelled_{false};
};

class WireClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&jobs_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port_);
  }
  void TearDown() override { server_->Shutdown(); }

  static absl::Time In(absl::Duration d) { return absl::Now() + d; }

  RecordingJobs jobs_;
  int port_ = 0;
  std::string address_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(WireClientTest, ACallArrivesWithItsTokenAndDeadlineAndItsAnswerIsParsed) {
  WireClient client(address_, "s3cret");
  loom::v1::CreateJobRequest request;
  request.mutable_spec()->set_name("sweep-1");
  loom::v1::Job job;
  grpc::Status s =
      client.Call("/loom.v1.JobService/CreateJob", request, &job, In(absl::Seconds(30)));
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(job.name(), "jobs/sweep-1");
  EXPECT_EQ(job.state(), loom::v1::QUEUED);
  const auto seen = jobs_.seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].authorization, "Bearer s3cret");
  EXPECT_THAT(seen[0].user_agent, HasSubstr("loomctl-wire"));
  // The deadline travelled as grpc-timeout: about 30 s left when the server looked.
  EXPECT_GT(seen[0].deadline_left, absl::Seconds(25));
  EXPECT_LE(seen[0].deadline_left, absl::Seconds(31));
}

TEST_F(WireClientTest, CallsShareOneConnectionAndSendNoTokenWhenThereIsNone) {
  WireClient client(address_, "");
  for (const char* name : {"jobs/a", "jobs/b", "jobs/c"}) {
    loom::v1::GetJobRequest request;
    request.set_name(name);
    loom::v1::Job job;
    ASSERT_TRUE(
        client.Call("/loom.v1.JobService/GetJob", request, &job, In(absl::Seconds(10))).ok());
    EXPECT_EQ(job.name(), name);
  }
  const auto seen = jobs_.seen();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].authorization, "");
  EXPECT_EQ(seen[0].peer, seen[1].peer);  // the same client port: one connection
  EXPECT_EQ(seen[1].peer, seen[2].peer);
}

TEST_F(WireClientTest, TheServersStatusAndMessageArriveAsSent) {
  WireClient client(address_, "");
  loom::v1::GetJobRequest request;
  loom::v1::Job job;
  job.set_name("untouched");
  request.set_name("jobs/missing");
  grpc::Status s = client.Call("/loom.v1.JobService/GetJob", request, &job, In(absl::Seconds(10)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "jobs/missing not found");
  EXPECT_EQ(job.name(), "untouched");

  request.set_name("jobs/odd-message");
  s = client.Call("/loom.v1.JobService/GetJob", request, &job, In(absl::Seconds(10)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "jobs/ünïcode: 100% gone\nsecond line");

  // A method the server does not have: gRPC's own UNIMPLEMENTED.
  s = client.Call("/loom.v1.JobService/NoSuchMethod", request, &job, In(absl::Seconds(10)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  // The connection is still good afterwards.
  request.set_name("jobs/ok");
  EXPECT_TRUE(client.Call("/loom.v1.JobService/GetJob", request, &job, In(absl::Seconds(10))).ok());
}

TEST_F(WireClientTest, AnAnswerOfManyFramesArrivesWhole) {
  WireClient client(address_, "");
  loom::v1::ListJobsRequest request;
  request.set_page_size(
      20'000);  // about 4.5 MB: hundreds of DATA frames, past every default window
  loom::v1::ListJobsResponse page;
  grpc::Status s =
      client.Call("/loom.v1.JobService/ListJobs", request, &page, In(absl::Seconds(30)));
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(page.jobs_size(), 20'000);
  EXPECT_EQ(page.jobs(19'999).name(), "jobs/j19999");
  EXPECT_EQ(page.jobs(19'999).state_reason(), std::string(200, 'r'));
}

TEST_F(WireClientTest, ASlowServerEndsInDeadlineExceededAtTheDeadline) {
  WireClient client(address_, "");
  loom::v1::GetJobRequest request;
  request.set_name("jobs/slow");
  loom::v1::Job job;
  const absl::Time start = absl::Now();
  grpc::Status s =
      client.Call("/loom.v1.JobService/GetJob", request, &job, In(absl::Milliseconds(200)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1.5));
  // No deadline at all (an infinite one) is a call like any other.
  request.set_name("jobs/fast");
  EXPECT_TRUE(
      client.Call("/loom.v1.JobService/GetJob", request, &job, absl::InfiniteFuture()).ok());
  request.set_name("jobs/slow");
  // A deadline already past: nothing is sent.
  s = client.Call("/loom.v1.JobService/GetJob", request, &job, absl::Now() - absl::Seconds(1));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
}

TEST_F(WireClientTest, ATokenThatCannotBeAHeaderIsRefusedBeforeAnythingIsSent) {
  WireClient client(address_, "abc\r\nx-evil: 1");
  loom::v1::GetJobRequest request;
  request.set_name("jobs/a");
  loom::v1::Job job;
  grpc::Status s = client.Call("/loom.v1.JobService/GetJob", request, &job, In(absl::Seconds(10)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("token"));
  EXPECT_TRUE(jobs_.seen().empty());
}

TEST_F(WireClientTest, NoServerIsUnavailableNamingTheAddress) {
  server_->Shutdown();
  WireClient client("127.0.0.1:1", "");
  loom::v1::GetJobRequest request;
  loom::v1::Job job;
  grpc::Status s = client.Call("/loom.v1.JobService/GetJob", request, &job, In(absl::Seconds(10)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("127.0.0.1:1"));
  WireClient bad("no-port-here", "");
  s = bad.Call("/loom.v1.JobService/GetJob", request, &job, In(absl::Seconds(10)));
  EXPECT_NE(s.error_code(), grpc::StatusCode::OK);
}

TEST_F(WireClientTest, AStreamsMessagesArriveInOrderThenItsStatus) {
  WireClient client(address_, "tok");
  loom::v1::StreamJobLogsRequest request;
  request.set_name("jobs/a");
  request.set_rank(5'000);  // about 1.5 MB: messages split across DATA frames
  int next = 0;
  bool in_order = true;
  grpc::Status s = client.CallStream(
      "/loom.v1.JobService/StreamJobLogs", request,
      [&](std::string_view bytes) {
        loom::v1::LogLine line;
        in_order = in_order && line.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())) &&
                   line.rank() == next &&
                   line.text() == std::to_string(next) + std::string(300, 'x');
        ++next;
        return true;
      },
      absl::InfiniteFuture());
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(next, 5'000);
  EXPECT_TRUE(in_order);
  const auto seen = jobs_.seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].authorization, "Bearer tok");
  // No deadline was sent: the server has none either.
  EXPECT_GT(seen[0].deadline_left, absl::Hours(24 * 365));

  // A stream that ends in an error: the messages before it, then the server's status.
  request.set_name("jobs/broken");
  next = 0;
  s = client.CallStream(
      "/loom.v1.JobService/StreamJobLogs", request,
      [&](std::string_view) {
        ++next;
        return true;
      },
      absl::InfiniteFuture());
  EXPECT_EQ(next, 2);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(s.error_message(), "the log file is gone");
  // A unary call after the streams, on the same client.
  loom::v1::GetJobRequest get;
  get.set_name("jobs/after");
  loom::v1::Job job;
  EXPECT_TRUE(client.Call("/loom.v1.JobService/GetJob", get, &job, In(absl::Seconds(10))).ok());
  EXPECT_EQ(job.name(), "jobs/after");
}

TEST_F(WireClientTest, AStreamTheCallerHasHadEnoughOfIsCancelledAtTheServer) {
  WireClient client(address_, "");
  loom::v1::StreamJobLogsRequest request;
  request.set_name("jobs/long");
  request.set_follow(true);  // the server writes for 10 s unless cancelled
  int got = 0;
  const absl::Time start = absl::Now();
  grpc::Status s = client.CallStream(
      "/loom.v1.JobService/StreamJobLogs", request, [&](std::string_view) { return ++got < 3; },
      absl::InfiniteFuture());
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(got, 3);
  // The server saw the cancellation long before its 10 s of writing were over.
  for (int i = 0; i < 500 && !jobs_.cancelled(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(jobs_.cancelled());
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
}

TEST_F(WireClientTest, AStreamWithADeadlineEndsAtIt) {
  WireClient client(address_, "");
  loom::v1::StreamJobLogsRequest request;
  request.set_name("jobs/long");
  request.set_follow(true);
  int got = 0;
  const absl::Time start = absl::Now();
  grpc::Status s = client.CallStream(
      "/loom.v1.JobService/StreamJobLogs", request,
      [&](std::string_view) {
        ++got;
        return true;
      },
      In(absl::Milliseconds(300)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_GT(got, 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// TLS as loomctl speaks it to a TLS loomd: against the CA it is given, or against the system's
// trusted certificates when none is given, which do not hold a development CA.
TEST(WireClientTls, StreamsOverTlsAndAnUntrustedServerIsRefusedWithoutACa) {
  const std::string certs = ::testing::TempDir() + "/wire_tls_" + std::to_string(::getpid());
  ASSERT_EQ(std::system(
                ("bash " LOOM_SOURCE_DIR "/scripts/dev-certs.sh " + certs + " >/dev/null").c_str()),
            0);
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back(
      {ReadWhole(certs + "/loomd.key"), ReadWhole(certs + "/loomd.pem")});
  RecordingJobs jobs;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(options), &port);
  builder.RegisterService(&jobs);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  loom::v1::StreamJobLogsRequest request;
  request.set_name("jobs/a");
  request.set_rank(50);
  {
    WireClient client(address, "", WireTls{certs + "/ca.pem", "", ""});
    int got = 0;
    grpc::Status s = client.CallStream(
        "/loom.v1.JobService/StreamJobLogs", request,
        [&](std::string_view) {
          ++got;
          return true;
        },
        absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(got, 50);
  }
  {
    WireClient client(address, "", WireTls{"", "", ""});
    loom::v1::GetJobRequest get;
    get.set_name("jobs/a");
    loom::v1::Job job;
    grpc::Status s =
        client.Call("/loom.v1.JobService/GetJob", get, &job, absl::Now() + absl::Seconds(30));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(s.error_message(), HasSubstr("not trusted"));
  }
  EXPECT_EQ(jobs.seen().size(), 1u);  // the refused client's call never arrived
  server->Shutdown();
  std::filesystem::remove_all(certs);
}

// A listener on loopback that, for each connection, reads what arrives for a moment, then writes
// `answer` and closes (a role: a server that is not gRPC, or a broken one).
class RawPeer {
 public:
  explicit RawPeer(std::string answer) : answer_(std::move(answer)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::listen(fd_, 4);
    socklen_t len = sizeof(addr);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      char buf[4096];
      timeval tv{0, 100'000};
      ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      (void)::recv(c, buf, sizeof(buf), 0);
      (void)::send(c, answer_.data(), answer_.size(), MSG_NOSIGNAL);
      ::close(c);
    });
  }
  ~RawPeer() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  std::string answer_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

TEST(WireClientPeers, APeerThatIsNotAGrpcServerIsAnErrorNotACrash) {
  const std::string answers[] = {
      "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",  // an HTTP/1 server
      "",                                                       // closes at once
      std::string(100, '\0') + std::string(50, '\xff'),         // garbage
      // A SETTINGS frame with a length that runs past what follows, then nothing.
      std::string("\x00\x00\x06\x04\x00\x00\x00\x00\x00", 9),
  };
  for (const std::string& answer : answers) {
    RawPeer peer(answer);
    WireClient client(peer.address(), "");
    loom::v1::GetJobRequest request;
    request.set_name("jobs/a");
    loom::v1::Job job;
    grpc::Status s =
        client.Call("/loom.v1.JobService/GetJob", request, &job, absl::Now() + absl::Seconds(5));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  }
}

TEST(WireClientHeaders, GrpcTimeoutAndPercentDecoding) {
  EXPECT_EQ(GrpcTimeoutHeader(absl::Seconds(5)), "5000m");
  EXPECT_EQ(GrpcTimeoutHeader(absl::Microseconds(10)), "1m");
  EXPECT_EQ(GrpcTimeoutHeader(-absl::Seconds(1)), "1m");
  EXPECT_EQ(GrpcTimeoutHeader(absl::Hours(100)), "360000S");
  EXPECT_EQ(GrpcTimeoutHeader(absl::InfiniteDuration()), "99999999S");
  EXPECT_EQ(PercentDecode("a%20b%25c"), "a b%c");
  EXPECT_EQ(PercentDecode("%C3%BC"), "\xc3\xbc");
  EXPECT_EQ(PercentDecode("50%"), "50%");
  EXPECT_EQ(PercentDecode("%zz%4"), "%zz%4");
}

}  // namespace
}  // namespace loom::client
