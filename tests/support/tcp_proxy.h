// TcpProxy: a test helper that forwards TCP connections from a loopback port to another loopback
// port and can drop every open connection at once, as a network fault does (the fault run drops
// the workers' sessions to loomd with it). Bytes pass through unchanged, so TLS stays end to end.
//
// One thread polls the listening socket and every connection pair; a write to a side whose
// buffer is full blocks that thread (a paused peer stalls the proxy, as it stalls its clients).
// The target port is asked for at each accept, so the target may restart on a new port.
// Thread-safe: port() and DropAll() may be called from any thread.
#ifndef LOOM_TESTS_SUPPORT_TCP_PROXY_H_
#define LOOM_TESTS_SUPPORT_TCP_PROXY_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

namespace loom::testing {

class TcpProxy {
 public:
  // Forwards to 127.0.0.1:`target_port()`.
  explicit TcpProxy(std::function<int()> target_port) : target_port_(std::move(target_port)) {}
  ~TcpProxy() { Stop(); }
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  // Listens on 127.0.0.1 on a free port and starts forwarding. False when the socket fails.
  bool Start() {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) return false;
    sockaddr_in addr = Loopback(0);
    socklen_t len = sizeof(addr);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(listen_fd_, 64) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
        ::pipe2(wake_, O_CLOEXEC) != 0) {
      return false;
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Loop(); });
    return true;
  }

  int port() const { return port_; }

  // Closes every connection open now (both sides: each peer sees its stream end); new
  // connections are forwarded as before. Returns at once; the drop happens on the proxy's thread.
  void DropAll() {
    drop_.store(true);
    Wake();
  }

  // Connections dropped by DropAll so far.
  int dropped() const { return dropped_.load(); }

  void Stop() {
    if (!thread_.joinable()) return;
    stop_.store(true);
    Wake();
    thread_.join();
    for (auto& [a, b] : pairs_) Close(a, b);
    pairs_.clear();
    for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
      if (fd >= 0) ::close(fd);
    }
  }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return addr;
  }
  static void Close(int a, int b) {
    ::shutdown(a, SHUT_RDWR);
    ::shutdown(b, SHUT_RDWR);
    ::close(a);
    ::close(b);
  }
  void Wake() {
    const char c = 0;
    if (wake_[1] >= 0) (void)!::write(wake_[1], &c, 1);
  }
  // Writes all of buf to fd; false when the peer is gone.
  static bool WriteAll(int fd, const char* buf, ssize_t n) {
    while (n > 0) {
      const ssize_t w = ::send(fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      buf += w;
      n -= w;
    }
    return true;
  }
  void Accept() {
    const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) return;
    const int upstream = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = Loopback(target_port_());
    if (upstream < 0 ||
        ::connect(upstream, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(client);  // the target is down: the client sees a refused-like close
      if (upstream >= 0) ::close(upstream);
      return;
    }
    const int one = 1;
    ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(upstream, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    pairs_.emplace_back(client, upstream);
  }
  void Loop() {
    std::vector<pollfd> fds;
    char buf[64 << 10];
    while (!stop_.load()) {
      if (drop_.exchange(false)) {
        for (auto& [a, b] : pairs_) Close(a, b);
        dropped_ += static_cast<int>(pairs_.size());
        pairs_.clear();
      }
      fds.clear();
      fds.push_back({listen_fd_, POLLIN, 0});
      fds.push_back({wake_[0], POLLIN, 0});
      for (auto& [a, b] : pairs_) {
        fds.push_back({a, POLLIN, 0});
        fds.push_back({b, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 1000) <= 0) continue;
      if (fds[1].revents != 0) {
        char drain[64];
        (void)!::read(wake_[0], drain, sizeof(drain));
      }
      // Pairs first (Accept appends to pairs_, which the indices below follow).
      std::vector<size_t> closed;
      for (size_t i = 0; i < pairs_.size(); ++i) {
        for (int side = 0; side < 2; ++side) {
          if (fds[2 + 2 * i + side].revents == 0) continue;
          const int from = side == 0 ? pairs_[i].first : pairs_[i].second;
          const int to = side == 0 ? pairs_[i].second : pairs_[i].first;
          const ssize_t n = ::read(from, buf, sizeof(buf));
          if (n <= 0 || !WriteAll(to, buf, n)) {
            closed.push_back(i);
            break;
          }
        }
      }
      for (auto it = closed.rbegin(); it != closed.rend(); ++it) {
        Close(pairs_[*it].first, pairs_[*it].second);
        pairs_.erase(pairs_.begin() + static_cast<long>(*it));
      }
      if (fds[0].revents & POLLIN) Accept();
    }
  }

  const std::function<int()> target_port_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> drop_{false};
  std::atomic<int> dropped_{0};
  std::vector<std::pair<int, int>> pairs_;  // (client, upstream); the proxy thread's alone
};

}  // namespace loom::testing

#endif  // LOOM_TESTS_SUPPORT_TCP_PROXY_H_
