#include "common/net.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

using ::testing::HasSubstr;

TEST(ParseHostPortTest, AcceptsTheUsualForms) {
  struct Case {
    const char* in;
    const char* host;
    int port;
  };
  for (const Case& c :
       {Case{"127.0.0.1:0", "127.0.0.1", 0}, Case{"[::1]:50051", "::1", 50051},
        Case{"localhost:80", "localhost", 80}, Case{"0.0.0.0:65535", "0.0.0.0", 65535},
        Case{"[::]:9090", "::", 9090},
        Case{"loomd.default.svc.cluster.local:443", "loomd.default.svc.cluster.local", 443},
        Case{"[fe80::1%eth0]:1", "fe80::1%eth0", 1},
        Case{"[::ffff:127.0.0.1]:7", "::ffff:127.0.0.1", 7}}) {
    auto hp = ParseHostPort(c.in);
    ASSERT_TRUE(hp.ok()) << c.in << ": " << hp.status();
    EXPECT_EQ(hp->host, c.host) << c.in;
    EXPECT_EQ(hp->port, c.port) << c.in;
    EXPECT_EQ(FormatHostPort(*hp), c.in);
  }
}

TEST(ParseHostPortTest, RejectsBadValuesNamingThem) {
  for (const char* bad : {"",
                          "localhost",
                          "localhost:",
                          ":80",
                          "::1:80",
                          "[::1]",
                          "[::1]80",
                          "[]:80",
                          "[::1:80",
                          "host:-1",
                          "host:65536",
                          "host:123456",
                          "host:8o",
                          "host:+80",
                          "host: 80",
                          "ho st:80",
                          "-host:80",
                          "[not-v6]:80",
                          "[1.2.3.4]:80",
                          "[fe80::1%]:80",
                          "host:80/path"}) {
    auto hp = ParseHostPort(bad);
    ASSERT_FALSE(hp.ok()) << "accepted \"" << bad << "\"";
    EXPECT_EQ(hp.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(hp.status().message(), HasSubstr(std::string("\"") + bad + "\""));
    EXPECT_THAT(hp.status().message(), HasSubstr("expected HOST:PORT"));
  }
}

TEST(FormatHostPortTest, BracketsIpv6) {
  EXPECT_EQ(FormatHostPort("::1", 5), "[::1]:5");
  EXPECT_EQ(FormatHostPort("10.0.0.1", 5), "10.0.0.1:5");
  EXPECT_EQ(FormatHostPort("node-1", 0), "node-1:0");
}

}  // namespace
}  // namespace loom
