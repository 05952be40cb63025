#include "common/metrics_http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/status_macros.h"

namespace loom::metrics {
namespace {

constexpr size_t kMaxRequestHead = 8 * 1024;
constexpr size_t kMaxConnections = 64;
constexpr std::chrono::milliseconds kConnectionDeadline{5000};
// After the response, unread request bytes are drained for at most this long before closing:
// closing a socket with unread input sends RST, which can destroy the response in flight.
constexpr std::chrono::milliseconds kDrainDeadline{1000};
constexpr size_t kMaxDrain = 64 * 1024;

using SteadyTime = std::chrono::steady_clock::time_point;

struct Connection {
  enum class Phase {
    kReading,   // collecting the request head
    kWriting,   // sending `out`
    kDraining,  // response sent and write side shut down; discarding input until EOF
  };
  int fd = -1;
  Phase phase = Phase::kReading;
  std::string in;      // request bytes read so far
  std::string out;     // the response, once decided
  size_t sent = 0;     // bytes of `out` written
  size_t drained = 0;  // bytes discarded while draining
  bool done = false;   // to be closed and removed
  SteadyTime deadline;
};

std::string Response(int code, std::string_view reason, std::string_view content_type,
                     std::string_view body, bool head_only, std::string_view extra_headers = "") {
  std::string out = "HTTP/1.1 " + std::to_string(code) + " ";
  out.append(reason);
  out.append("\r\nContent-Type: ");
  out.append(content_type);
  out.append("\r\nContent-Length: " + std::to_string(body.size()) + "\r\n");
  out.append(extra_headers);
  out.append("Connection: close\r\n\r\n");
  if (!head_only) out.append(body);
  return out;
}

std::string PlainResponse(int code, std::string_view reason, bool head_only = false,
                          std::string_view extra_headers = "") {
  const std::string body = std::string(reason) + "\n";
  return Response(code, reason, "text/plain; charset=utf-8", body, head_only, extra_headers);
}

bool IsTokenChar(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

// Builds the response to one complete request head (request line and headers, without the
// final empty line). Never throws, whatever the bytes.
std::string HandleRequest(std::string_view head, Registry* registry) {
  const size_t eol = head.find('\n');
  std::string_view line = head.substr(0, eol);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);

  // METHOD SP TARGET SP HTTP/1.x
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos ||
      line.find(' ', sp2 + 1) != std::string_view::npos) {
    return PlainResponse(400, "Bad Request");
  }
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (method.empty() || !std::all_of(method.begin(), method.end(), IsTokenChar) || target.empty() ||
      target.front() != '/' || !(version == "HTTP/1.1" || version == "HTTP/1.0")) {
    return PlainResponse(400, "Bad Request");
  }
  for (char c : target) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      return PlainResponse(400, "Bad Request");
  }
  // Every header line must be "name: value".
  std::string_view rest = eol == std::string_view::npos ? "" : head.substr(eol + 1);
  while (!rest.empty()) {
    const size_t e = rest.find('\n');
    std::string_view h = rest.substr(0, e);
    rest = e == std::string_view::npos ? "" : rest.substr(e + 1);
    if (!h.empty() && h.back() == '\r') h.remove_suffix(1);
    if (h.empty()) continue;
    const size_t colon = h.find(':');
    if (colon == 0 || colon == std::string_view::npos) return PlainResponse(400, "Bad Request");
  }

  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) {
    return PlainResponse(405, "Method Not Allowed", false, "Allow: GET, HEAD\r\n");
  }
  const std::string_view path = target.substr(0, target.find('?'));
  if (path == "/metrics") {
    return Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", registry->Serialize(),
                    head_only);
  }
  if (path == "/healthz") {
    return Response(200, "OK", "text/plain; charset=utf-8", "ok", head_only);
  }
  return PlainResponse(404, "Not Found", head_only);
}

// The end of the request head ("\r\n\r\n", or "\n\n" from lenient clients), or npos.
size_t FindHeadEnd(std::string_view in) {
  const size_t crlf = in.find("\r\n\r\n");
  const size_t lf = in.find("\n\n");
  return std::min(crlf, lf);
}

// Reads what is available. Returns false when the peer closed its side or the socket failed.
bool ReadAvailable(Connection& c) {
  char buf[4096];
  while (c.in.size() <= kMaxRequestHead) {
    const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;  // EOF or error
  }
  return true;
}

// Writes what the socket takes; marks the connection done when finished or failed.
void WriteAvailable(Connection& c) {
  while (c.sent < c.out.size()) {
    const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n > 0) {
      c.sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    c.done = true;
    return;
  }
  // Sent: signal the end of the response, then drain (see kDrainDeadline).
  ::shutdown(c.fd, SHUT_WR);
  c.phase = Connection::Phase::kDraining;
  c.deadline = std::min(c.deadline, std::chrono::steady_clock::now() + kDrainDeadline);
}

// Discards input; marks the connection done at EOF, on error, or after kMaxDrain bytes.
void Drain(Connection& c) {
  char buf[4096];
  while (c.drained < kMaxDrain) {
    const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
    if (n > 0) {
      c.drained += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    break;
  }
  c.done = true;
}

void Respond(Connection& c, std::string response) {
  c.out = std::move(response);
  c.phase = Connection::Phase::kWriting;
  WriteAvailable(c);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host_port, Registry* registry) {
  ASSIGN_OR_RETURN(const HostPort hp, ParseHostPort(host_port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_str = std::to_string(hp.port);
  const int gai = ::getaddrinfo(hp.host.c_str(), port_str.c_str(), &hints, &res);
  if (gai != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address \"", host_port, "\": cannot resolve the host: ", ::gai_strerror(gai)));
  }
  int fd = -1;
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
      last_error = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for metrics on ", host_port, ": ", last_error));
  }

  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  char host[NI_MAXHOST] = {0};
  char serv[NI_MAXSERV] = {0};
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0 ||
      ::getnameinfo(reinterpret_cast<sockaddr*>(&bound), len, host, sizeof(host), serv,
                    sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot read the bound address of ", host_port));
  }
  int wake[2];
  if (::pipe2(wake, O_NONBLOCK | O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot create a pipe: ", std::strerror(err)));
  }
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(fd, wake[0], wake[1], host, std::atoi(serv), registry));
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, int wake_read_fd, int wake_write_fd,
                                     std::string host, int port, Registry* registry)
    : listen_fd_(listen_fd),
      wake_read_fd_(wake_read_fd),
      wake_write_fd_(wake_write_fd),
      host_(std::move(host)),
      port_(port),
      registry_(registry) {
  loop_thread_ = std::thread([this] { Loop(); });
}

MetricsHttpServer::~MetricsHttpServer() {
  stopping_.store(true);
  const char byte = 1;
  ssize_t unused = ::write(wake_write_fd_, &byte, 1);
  (void)unused;
  loop_thread_.join();
  ::close(listen_fd_);
  ::close(wake_read_fd_);
  ::close(wake_write_fd_);
}

std::string MetricsHttpServer::address() const { return FormatHostPort(host_, port_); }

void MetricsHttpServer::Loop() {
  std::vector<Connection> conns;
  std::vector<pollfd> fds;
  while (!stopping_.load()) {
    // Poll set: [0] listener, [1] wake pipe, [2..] connections in `conns` order.
    fds.clear();
    fds.push_back({listen_fd_, POLLIN, 0});
    fds.push_back({wake_read_fd_, POLLIN, 0});
    SteadyTime now = std::chrono::steady_clock::now();
    int timeout_ms = -1;
    for (const Connection& c : conns) {
      const short events = c.phase == Connection::Phase::kWriting ? POLLOUT : POLLIN;
      fds.push_back({c.fd, events, 0});
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - now).count();
      const int ms = static_cast<int>(std::max<int64_t>(0, left)) + 1;
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    }
    const int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) {
      LOOM_LOG(ERROR) << "metrics server: poll failed: " << std::strerror(errno);
      break;
    }
    if (stopping_.load()) break;
    now = std::chrono::steady_clock::now();

    for (size_t i = 0; n > 0 && i < conns.size(); ++i) {
      Connection& c = conns[i];
      const short rev = fds[i + 2].revents;
      if (rev == 0) continue;
      if (rev & POLLNVAL) {
        c.done = true;
        continue;
      }
      if (c.phase == Connection::Phase::kReading) {
        const bool open = ReadAvailable(c);
        const size_t end = FindHeadEnd(c.in);
        if (end != std::string::npos && end <= kMaxRequestHead) {
          Respond(c, HandleRequest(std::string_view(c.in).substr(0, end), registry_));
        } else if (c.in.size() > kMaxRequestHead) {
          Respond(c, PlainResponse(431, "Request Header Fields Too Large"));
        } else if (!open) {
          // The peer stopped sending before a complete head: answer garbage with 400 (it may
          // still read), and just drop a connection that sent nothing.
          if (c.in.empty()) {
            c.done = true;
          } else {
            Respond(c, PlainResponse(400, "Bad Request"));
          }
        }
      } else if (c.phase == Connection::Phase::kWriting) {
        WriteAvailable(c);
      } else {
        Drain(c);
      }
    }
    for (Connection& c : conns) {
      if (!c.done && now >= c.deadline) c.done = true;  // too slow: drop it
    }
    for (Connection& c : conns) {
      if (c.done) ::close(c.fd);
    }
    std::erase_if(conns, [](const Connection& c) { return c.done; });

    if (fds[0].revents & POLLIN) {
      while (true) {
        const int cfd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) break;  // EAGAIN (drained) or a transient error; poll again
        if (conns.size() >= kMaxConnections) {
          // Bounded: a flood of idle connections cannot exhaust descriptors, and the oldest one
          // makes room so that a fresh scrape still gets through.
          auto oldest = std::min_element(
              conns.begin(), conns.end(),
              [](const Connection& a, const Connection& b) { return a.deadline < b.deadline; });
          ::close(oldest->fd);
          conns.erase(oldest);
        }
        Connection c;
        c.fd = cfd;
        c.deadline = now + kConnectionDeadline;
        conns.push_back(std::move(c));
      }
    }
  }
  for (const Connection& c : conns) ::close(c.fd);
}

}  // namespace loom::metrics
