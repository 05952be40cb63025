#include "common/metrics_http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::metrics {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A blocking IPv4 client socket connected to 127.0.0.1:port, or -1.
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    data.remove_prefix(n);
  }
}

// Reads until the server closes the connection (or `timeout` passes).
std::string ReadToEof(int fd, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, n);
  }
  return out;
}

// One request on a fresh connection; returns the whole raw response.
std::string Request(int port, std::string_view raw) {
  const int fd = Connect(port);
  if (fd < 0) return "connect failed";
  SendAll(fd, raw);
  std::string response = ReadToEof(fd);
  ::close(fd);
  return response;
}

std::string Body(const std::string& response) {
  const size_t p = response.find("\r\n\r\n");
  return p == std::string::npos ? "" : response.substr(p + 4);
}

class MetricsHttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_.GetCounter("loom_test_total", "A test counter.", {{"k", "v\"q"}}).Increment(4);
    registry_.GetGauge("loom_test_gauge", "A test gauge.").Set(1.5);
    auto server = MetricsHttpServer::Start("127.0.0.1:0", &registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  Registry registry_;
  std::unique_ptr<MetricsHttpServer> server_;
};

TEST_F(MetricsHttpServerTest, ReportsTheBoundAddress) {
  EXPECT_GT(server_->port(), 0);
  EXPECT_EQ(server_->address(), "127.0.0.1:" + std::to_string(server_->port()));
}

TEST_F(MetricsHttpServerTest, MetricsReturnsWhatSerializeReturns) {
  const std::string response =
      Request(server_->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n");
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(response, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(response, HasSubstr("Connection: close\r\n"));
  const std::string expected = registry_.Serialize();
  EXPECT_THAT(response, HasSubstr("Content-Length: " + std::to_string(expected.size()) + "\r\n"));
  EXPECT_EQ(Body(response), expected);
  EXPECT_THAT(expected, HasSubstr("loom_test_total{k=\"v\\\"q\"} 4\n"));
}

TEST_F(MetricsHttpServerTest, EachScrapeRunsTheCollectHooks) {
  int scrapes = 0;
  registry_.AddCollectHook([&] { registry_.GetGauge("loom_scrapes", "h").Set(++scrapes); });
  Request(server_->port(), "GET /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(Body(Request(server_->port(), "GET /metrics?x=1 HTTP/1.0\r\n\r\n")),
              HasSubstr("loom_scrapes 2\n"));
}

TEST_F(MetricsHttpServerTest, HealthzNotFoundAndMethods) {
  const std::string health = Request(server_->port(), "GET /healthz HTTP/1.1\r\n\r\n");
  EXPECT_THAT(health, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(Body(health), "ok");
  EXPECT_THAT(Request(server_->port(), "GET /nope HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 404 "));
  EXPECT_THAT(Request(server_->port(), "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
              StartsWith("HTTP/1.1 405 "));
  const std::string head = Request(server_->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(Body(head), "");
}

TEST_F(MetricsHttpServerTest, GarbageGets400) {
  for (const char* garbage :
       {"hello\r\n\r\n", "GET\r\n\r\n", "GET /metrics\r\n\r\n", "GET metrics HTTP/1.1\r\n\r\n",
        "GET /metrics HTTP/9.9\r\n\r\n", "G@T /metrics HTTP/1.1\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", "\x01\x02\x03\xff\r\n\r\n"}) {
    EXPECT_THAT(Request(server_->port(), garbage), StartsWith("HTTP/1.1 400 ")) << garbage;
  }
  // Bytes without a complete head, then the client half-closes: 400 as well.
  const int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  SendAll(fd, "\x16\x03\x01 tls hello?");
  ::shutdown(fd, SHUT_WR);
  EXPECT_THAT(ReadToEof(fd), StartsWith("HTTP/1.1 400 "));
  ::close(fd);
}

TEST_F(MetricsHttpServerTest, RandomBytesAlwaysGetAnAnswerAndTheServerKeepsServing) {
  std::mt19937 rng(42);
  for (int i = 0; i < 200; ++i) {
    std::string junk(std::uniform_int_distribution<int>(1, 300)(rng), '\0');
    for (char& c : junk) c = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
    if (i % 2 == 0) junk = "GET /" + junk;  // half of them look almost like a request
    const std::string response = Request(server_->port(), junk + "\r\n\r\n");
    EXPECT_THAT(response, StartsWith("HTTP/1.1 ")) << i;
  }
  EXPECT_THAT(Request(server_->port(), "GET /healthz HTTP/1.1\r\n\r\n"),
              StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST_F(MetricsHttpServerTest, AnUnreadRequestBodyDoesNotDestroyTheResponse) {
  // The server answers after the head and never reads the body; it must drain it before
  // closing, or the kernel's RST could wipe the response out at the client.
  const std::string body(30000, 'x');
  EXPECT_THAT(
      Request(server_->port(), "POST /metrics HTTP/1.1\r\nContent-Length: 30000\r\n\r\n" + body),
      StartsWith("HTTP/1.1 405 "));
}

TEST_F(MetricsHttpServerTest, OversizedHeadGets431) {
  std::string big = "GET /metrics HTTP/1.1\r\nX-Filler: " + std::string(20000, 'a') + "\r\n\r\n";
  EXPECT_THAT(Request(server_->port(), big), StartsWith("HTTP/1.1 431 "));
}

TEST_F(MetricsHttpServerTest, SilentAndTricklingClientsDoNotBlockTheNextScrape) {
  const int silent = Connect(server_->port());
  ASSERT_GE(silent, 0);
  const int trickle = Connect(server_->port());
  ASSERT_GE(trickle, 0);
  SendAll(trickle, "GET /met");
  const auto start = std::chrono::steady_clock::now();
  const std::string response = Request(server_->port(), "GET /metrics HTTP/1.1\r\n\r\n");
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_LT(elapsed, std::chrono::seconds(1));
  // The trickling client can still finish its request.
  SendAll(trickle, "rics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(Body(ReadToEof(trickle)), registry_.Serialize());
  ::close(trickle);
  ::close(silent);
}

TEST_F(MetricsHttpServerTest, IdleConnectionIsDroppedAfterTheDeadline) {
  const int silent = Connect(server_->port());
  ASSERT_GE(silent, 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(ReadToEof(silent, std::chrono::seconds(15)), "");  // closed without a response
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, std::chrono::seconds(4));
  EXPECT_LT(elapsed, std::chrono::seconds(10));
  ::close(silent);
}

TEST_F(MetricsHttpServerTest, AFloodOfIdleConnectionsDoesNotLockOutScrapes) {
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) {
    const int fd = Connect(server_->port());
    if (fd >= 0) idle.push_back(fd);
  }
  EXPECT_EQ(idle.size(), 200u);
  EXPECT_THAT(Request(server_->port(), "GET /healthz HTTP/1.1\r\n\r\n"),
              StartsWith("HTTP/1.1 200 OK\r\n"));
  for (int fd : idle) ::close(fd);
}

TEST_F(MetricsHttpServerTest, StopsPromptlyWithAnIdleConnectionOpen) {
  const int silent = Connect(server_->port());
  ASSERT_GE(silent, 0);
  const auto start = std::chrono::steady_clock::now();
  server_.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_EQ(ReadToEof(silent, std::chrono::seconds(2)), "");
  ::close(silent);
}

TEST(MetricsHttpServerStartTest, BadAddressIsInvalidArgument) {
  Registry r;
  auto server = MetricsHttpServer::Start("no-port-here", &r);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("no-port-here"));
}

TEST(MetricsHttpServerStartTest, PortInUseIsUnavailable) {
  Registry r;
  auto first = MetricsHttpServer::Start("127.0.0.1:0", &r);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = MetricsHttpServer::Start((*first)->address(), &r);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr((*first)->address()));
}

TEST(MetricsHttpServerStartTest, ServesOnIpv6LoopbackWhenAvailable) {
  Registry r;
  auto server = MetricsHttpServer::Start("[::1]:0", &r);
  if (!server.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << server.status();
  EXPECT_EQ((*server)->address(), "[::1]:" + std::to_string((*server)->port()));
  const int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_port = htons(static_cast<uint16_t>((*server)->port()));
  addr.sin6_addr = in6addr_loopback;
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  SendAll(fd, "GET /healthz HTTP/1.1\r\n\r\n");
  EXPECT_THAT(ReadToEof(fd), EndsWith("\r\n\r\nok"));
  ::close(fd);
}

}  // namespace
}  // namespace loom::metrics
