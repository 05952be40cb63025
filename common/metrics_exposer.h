// The HTTP endpoint Prometheus scrapes: prometheus-cpp's Exposer (civetweb underneath) serving a
// metrics::Registry at GET /metrics (text exposition format 0.0.4, gzip when asked for). Paths
// that do not start with /metrics are 404 (civetweb matches by prefix). There is no /healthz:
// Kubernetes probes loomd and the worker over gRPC health.
//
// Hardening, through civetweb's options: a bounded pool of request threads (Options::threads),
// and a request timeout after which a connection that has not sent a whole request is dropped. A
// connection that sends nothing holds one thread until that timeout, so up to threads - 1 silent
// (or trickling) clients cannot delay a scrape; a flood of them delays it by up to one timeout
// per `threads` of them queued ahead of it (civetweb serves accepted connections in order).
// Requests are bounded to 8 KiB; connections are not kept alive. prometheus-cpp adds its own series
// to the endpoint (exposer_scrapes_total, exposer_transferred_bytes_total,
// exposer_request_latencies).
//
// IPv4 only: Debian 12's civetweb is built without IPv6, so an IPv6 address is INVALID_ARGUMENT.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace loom::metrics {

class MetricsExposer {
 public:
  struct Options {
    int threads = 4;
    absl::Duration request_timeout = absl::Seconds(5);
  };

  // Binds `host_port` ("127.0.0.1:0", "0.0.0.0:9090", "localhost:0"; port 0 picks a free port)
  // and starts serving `registry`, which must outlive the exposer. Errors: INVALID_ARGUMENT for a
  // bad or IPv6 address or a host that does not resolve, UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsExposer>> Start(const std::string& host_port,
                                                               Registry* registry);
  static absl::StatusOr<std::unique_ptr<MetricsExposer>> Start(const std::string& host_port,
                                                               Registry* registry,
                                                               const Options& options);

  // Stops serving; returns once no scrape is running.
  ~MetricsExposer();
  MetricsExposer(const MetricsExposer&) = delete;
  MetricsExposer& operator=(const MetricsExposer&) = delete;

  // The bound port (the real one when 0 was asked for).
  int port() const { return port_; }
  // The bound address as host:port with a numeric host, e.g. "127.0.0.1:41235" (also when a name
  // such as "localhost" was given).
  std::string address() const;

 private:
  MetricsExposer(std::unique_ptr<prometheus::Exposer> exposer, std::string host, int port);

  std::unique_ptr<prometheus::Exposer> exposer_;
  const std::string host_;
  const int port_;
};

}  // namespace loom::metrics
