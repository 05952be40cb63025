// A tiny HTTP/1.1 server for Prometheus scrapes, over POSIX sockets.
//   GET /metrics  -> 200, Content-Type: text/plain; version=0.0.4, body = registry->Serialize()
//   GET /healthz  -> 200 "ok"
//   other paths   -> 404;  other methods -> 405;  a malformed request -> 400
// HEAD is answered like GET without a body. Every response closes the connection.
//
// Design: one thread runs a poll() loop over the listening socket and every open connection
// (non-blocking sockets, per-connection buffers). Because no connection is ever read with a
// blocking call, a client that connects and sends nothing — or trickles bytes — cannot delay
// anyone else's scrape. Bounds: 8 KiB of request head (431 beyond), 64 open connections (beyond
// that the oldest is dropped to make room, so a fresh scrape always gets in), and a 5 s deadline
// per connection after which it is dropped. Query strings are ignored (/metrics?x=y is /metrics).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace loom::metrics {

class MetricsHttpServer {
 public:
  // Binds `host_port` ("127.0.0.1:0", "[::1]:9090", "0.0.0.0:9090", "localhost:0"; port 0 picks a
  // free port), listens, and starts serving on a background thread. `registry` must outlive the
  // server. Errors: INVALID_ARGUMENT for a bad address, UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host_port,
                                                                  Registry* registry);

  // Stops the loop thread and closes every socket. Open connections are dropped.
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The bound port (the real one when 0 was asked for).
  int port() const { return port_; }
  // The bound address as host:port, e.g. "127.0.0.1:41235" or "[::1]:41235" (the numeric host
  // that was bound, also when a name such as "localhost" was given).
  std::string address() const;

 private:
  MetricsHttpServer(int listen_fd, int wake_read_fd, int wake_write_fd, std::string host, int port,
                    Registry* registry);
  void Loop();  // runs on loop_thread_ until stopping_

  const int listen_fd_;
  const int wake_read_fd_;  // the destructor writes to wake_write_fd_ to end Loop()'s poll()
  const int wake_write_fd_;
  const std::string host_;
  const int port_;
  Registry* const registry_;
  std::atomic<bool> stopping_{false};
  std::thread loop_thread_;
};

}  // namespace loom::metrics
