// The metrics endpoint over prometheus-cpp's Exposer: real sockets on loopback.
#include "common/metrics_exposer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom::metrics {
namespace {

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
std::string Request(int port, std::string_view raw,
                    std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const int fd = Connect(port);
  if (fd < 0) return "connect failed";
  SendAll(fd, raw);
  std::string response = ReadToEof(fd, timeout);
  ::close(fd);
  return response;
}

std::string Body(const std::string& response) {
  const size_t p = response.find("\r\n\r\n");
  return p == std::string::npos ? "" : response.substr(p + 4);
}

constexpr char kScrape[] = "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n";

class MetricsExposerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_.GetCounter("loom_test_total", "A test counter.", {{"k", "v\"q"}}).Increment(4);
    registry_.GetGauge("loom_test_gauge", "A test gauge.").Set(1.5);
  }
  // Starts the exposer on 127.0.0.1:0 with `options`.
  void Start(const MetricsExposer::Options& options = {}) {
    auto exposer = MetricsExposer::Start("127.0.0.1:0", &registry_, options);
    ASSERT_TRUE(exposer.ok()) << exposer.status();
    exposer_ = std::move(*exposer);
  }

  Registry registry_;
  std::unique_ptr<MetricsExposer> exposer_;
};

TEST_F(MetricsExposerTest, ServesTheRegistryOnTheBoundPort) {
  Start();
  EXPECT_GT(exposer_->port(), 0);
  EXPECT_EQ(exposer_->address(), "127.0.0.1:" + std::to_string(exposer_->port()));
  const std::string response = Request(exposer_->port(), kScrape);
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(response, HasSubstr("Content-Type: text/plain"));
  // prometheus-cpp's Exposer adds its own series (exposer_scrapes_total, ...) to the registry's.
  EXPECT_THAT(Body(response), HasSubstr(registry_.Serialize()));
  EXPECT_THAT(Body(response), HasSubstr("loom_test_total{k=\"v\\\"q\"} 4\n"));
}

TEST_F(MetricsExposerTest, EachScrapeRunsTheCollectHooks) {
  Start();
  int scrapes = 0;
  registry_.AddCollectHook([&] { registry_.GetGauge("loom_scrapes", "h").Set(++scrapes); });
  Request(exposer_->port(), kScrape);
  EXPECT_THAT(Body(Request(exposer_->port(), kScrape)), HasSubstr("loom_scrapes 2\n"));
}

TEST_F(MetricsExposerTest, OtherPathsAreNotFound) {
  Start();
  // There is no /healthz: probes use gRPC health.
  for (const char* path : {"/healthz", "/", "/favicon.ico"}) {
    EXPECT_THAT(Request(exposer_->port(), std::string("GET ") + path + " HTTP/1.1\r\n\r\n"),
                StartsWith("HTTP/1.1 404"))
        << path;
  }
}

TEST_F(MetricsExposerTest, SilentAndTricklingClientsDoNotBlockAScrape) {
  // A request timeout far beyond the test's patience: the scrape must not wait for it.
  Start({.threads = 4, .request_timeout = absl::Seconds(60)});
  const int silent = Connect(exposer_->port());
  const int trickling = Connect(exposer_->port());
  ASSERT_GE(silent, 0);
  ASSERT_GE(trickling, 0);
  SendAll(trickling, "GET /met");
  const absl::Time start = absl::Now();
  const std::string response = Request(exposer_->port(), kScrape, std::chrono::milliseconds(5000));
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  ::close(silent);
  ::close(trickling);
}

TEST_F(MetricsExposerTest, ASilentConnectionIsDroppedAfterTheRequestTimeout) {
  Start({.threads = 1, .request_timeout = absl::Milliseconds(300)});
  const int silent = Connect(exposer_->port());
  ASSERT_GE(silent, 0);
  const absl::Time start = absl::Now();
  ReadToEof(silent, std::chrono::milliseconds(20000));  // returns when the server closes it
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ::close(silent);
  // The one request thread is free again.
  EXPECT_THAT(Request(exposer_->port(), kScrape, std::chrono::milliseconds(5000)),
              StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST_F(MetricsExposerTest, StopsPromptly) {
  Start();
  EXPECT_THAT(Request(exposer_->port(), kScrape), StartsWith("HTTP/1.1 200 OK\r\n"));
  const absl::Time start = absl::Now();
  exposer_.reset();
  // Civetweb alone takes its 2 s poll quantum to notice the stop (each loomd and worker
  // shutdown would wait for it).
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
}

TEST(MetricsExposerStartTest, ResolvesNamesToANumericAddress) {
  Registry r;
  auto exposer = MetricsExposer::Start("localhost:0", &r);
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  EXPECT_EQ((*exposer)->address(), "127.0.0.1:" + std::to_string((*exposer)->port()));
}

TEST(MetricsExposerStartTest, BadAndIpv6AddressesAreInvalidArgument) {
  Registry r;
  for (const char* bad : {"", "nonsense", "127.0.0.1", "127.0.0.1:99999"}) {
    auto exposer = MetricsExposer::Start(bad, &r);
    ASSERT_FALSE(exposer.ok()) << bad;
    EXPECT_EQ(exposer.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  auto v6 = MetricsExposer::Start("[::1]:0", &r);
  ASSERT_FALSE(v6.ok());
  EXPECT_EQ(v6.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v6.status().message(), HasSubstr("IPv6 is not supported"));
}

TEST(MetricsExposerStartTest, PortInUseIsUnavailable) {
  Registry r;
  auto first = MetricsExposer::Start("127.0.0.1:0", &r);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = MetricsExposer::Start((*first)->address(), &r);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr((*first)->address()));
}

}  // namespace
}  // namespace loom::metrics
