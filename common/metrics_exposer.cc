#include "common/metrics_exposer.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "prometheus/exposer.h"

namespace loom::metrics {
namespace {

// The numeric IPv4 address of `host` (a literal or a name), for civetweb's listening_ports.
absl::StatusOr<std::string> ResolveIpv4(const std::string& host, const std::string& host_port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (gai != 0) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address \"", host_port,
                                                   "\": cannot resolve the host to an IPv4 "
                                                   "address: ",
                                                   ::gai_strerror(gai)));
  }
  char numeric[NI_MAXHOST] = {0};
  const int ni = ::getnameinfo(res->ai_addr, res->ai_addrlen, numeric, sizeof(numeric), nullptr, 0,
                               NI_NUMERICHOST);
  ::freeaddrinfo(res);
  if (ni != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", host_port,
                     "\": cannot format the resolved host: ", ::gai_strerror(ni)));
  }
  return std::string(numeric);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsExposer>> MetricsExposer::Start(const std::string& host_port,
                                                                      Registry* registry) {
  return Start(host_port, registry, Options{});
}

absl::StatusOr<std::unique_ptr<MetricsExposer>> MetricsExposer::Start(const std::string& host_port,
                                                                      Registry* registry,
                                                                      const Options& options) {
  ASSIGN_OR_RETURN(const HostPort hp, ParseHostPort(host_port));
  if (hp.host.find(':') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address \"", host_port,
        "\": IPv6 is not supported (Debian 12's civetweb, which serves the metrics, is built "
        "without it); use an IPv4 address such as 127.0.0.1:0 or 0.0.0.0:9090"));
  }
  ASSIGN_OR_RETURN(const std::string ip, ResolveIpv4(hp.host, host_port));
  const std::vector<std::string> civetweb_options = {
      "listening_ports",
      absl::StrCat(ip, ":", hp.port),
      "num_threads",
      absl::StrCat(std::max(options.threads, 1)),
      "request_timeout_ms",
      absl::StrCat(std::max<int64_t>(absl::ToInt64Milliseconds(options.request_timeout), 1)),
      "max_request_size",
      "8192",
      "enable_keep_alive",
      "no",
  };
  std::unique_ptr<prometheus::Exposer> exposer;
  // The one place prometheus-cpp throws at run time: CivetServer's constructor, when it cannot
  // bind (or start). The control plane has no exceptions, so it ends here as a status.
  try {
    exposer = std::make_unique<prometheus::Exposer>(civetweb_options);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot listen for metrics on ", host_port,
                                               " (address in use or not local?): ", e.what(),
                                               "; pick another address or port 0"));
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.size() != 1 || ports[0] <= 0) {
    return absl::InternalError(absl::StrCat("cannot read the bound port of ", host_port));
  }
  exposer->RegisterCollectable(registry->Collectable());
  return std::unique_ptr<MetricsExposer>(new MetricsExposer(std::move(exposer), ip, ports[0]));
}

MetricsExposer::MetricsExposer(std::unique_ptr<prometheus::Exposer> exposer, std::string host,
                               int port)
    : exposer_(std::move(exposer)), host_(std::move(host)), port_(port) {}

// prometheus::Exposer's destructor stops civetweb, which joins its threads. Civetweb's accept
// thread only sees the stop flag when its poll() of the listening socket returns, which without a
// connection is after a 2 s quantum; every loomd and worker shutdown (and every test that starts
// one) would wait for it. So a helper connects to the port until the destructor has returned.
MetricsExposer::~MetricsExposer() {
  std::atomic<bool> stopped{false};
  std::thread waker([this, &stopped] {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    // A wildcard bind is reached on loopback.
    if (host_ == "0.0.0.0" || ::inet_pton(AF_INET, host_.c_str(), &addr.sin_addr) != 1) {
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    }
    while (!stopped.load()) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd >= 0) {
        (void)::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
        ::close(fd);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  exposer_.reset();
  stopped.store(true);
  waker.join();
}

std::string MetricsExposer::address() const { return FormatHostPort(host_, port_); }

}  // namespace loom::metrics
