#include "client/wire_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/net.h"

namespace loom::client {
namespace {

using grpc::StatusCode;

// What one call has received so far. The nghttp2 callbacks write it; Call reads it at the end.
struct CallState {
  int32_t stream_id = -1;
  std::string request;  // the length-prefixed request message
  size_t request_sent = 0;
  int http_status = 0;
  std::string content_type;
  std::optional<int> grpc_status;
  std::string grpc_message;
  std::string body;  // the length-prefixed response message(s)
  bool too_large = false;
  bool closed = false;
  uint32_t reset_code = 0;  // the HTTP/2 error code that closed the stream; 0 when it ended well
  // A server stream (CallStream): each whole message goes to `on_message` as it arrives, and
  // `body` keeps only what follows the last one (from `consumed` on).
  absl::FunctionRef<bool(std::string_view)>* on_message = nullptr;
  size_t consumed = 0;
  bool stopped = false;     // on_message asked for no more
  bool compressed = false;  // a message came compressed, which was not asked for
};

// Milliseconds until `deadline`, for poll(): at least 0, at most a day.
int PollTimeout(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left), 86'400'000) + 1);
}

// Waits until `fd` is ready for `events`; false at the deadline (never, for InfiniteFuture).
bool WaitFor(int fd, short events, absl::Time deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, PollTimeout(deadline));
    if (n > 0) return true;
    if (n == 0) {
      if (deadline == absl::InfiniteFuture()) continue;
      return false;
    }
    if (errno != EINTR) return true;  // let the read or write report the error
  }
}

// The gRPC code for an HTTP status without grpc-status (the gRPC HTTP/2 protocol's table).
StatusCode CodeForHttpStatus(int http) {
  switch (http) {
    case 400:
      return StatusCode::INTERNAL;
    case 401:
      return StatusCode::UNAUTHENTICATED;
    case 403:
      return StatusCode::PERMISSION_DENIED;
    case 404:
      return StatusCode::UNIMPLEMENTED;
    case 429:
    case 502:
    case 503:
    case 504:
      return StatusCode::UNAVAILABLE;
    default:
      return StatusCode::UNKNOWN;
  }
}

// The gRPC code for a stream the server reset (RST_STREAM's error code); `otherwise` for codes
// that say nothing more than that the call failed.
StatusCode CodeForReset(uint32_t code, StatusCode otherwise) {
  switch (code) {
    case NGHTTP2_REFUSED_STREAM:
      return StatusCode::UNAVAILABLE;
    case NGHTTP2_CANCEL:
      return StatusCode::CANCELLED;
    case NGHTTP2_ENHANCE_YOUR_CALM:
      return StatusCode::RESOURCE_EXHAUSTED;
    case NGHTTP2_INADEQUATE_SECURITY:
      return StatusCode::PERMISSION_DENIED;
    default:
      return otherwise;
  }
}

int OnHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
             const uint8_t* value, size_t valuelen, uint8_t, void* user_data) {
  auto* call = static_cast<CallState*>(user_data);
  if (call == nullptr || frame->hd.stream_id != call->stream_id) return 0;
  const std::string_view n(reinterpret_cast<const char*>(name), namelen);
  const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
  if (n == ":status") {
    int status = 0;
    if (absl::SimpleAtoi(absl::string_view(v.data(), v.size()), &status))
      call->http_status = status;
  } else if (n == "content-type") {
    call->content_type = std::string(v);
  } else if (n == "grpc-status") {
    int code = 0;
    call->grpc_status =
        absl::SimpleAtoi(absl::string_view(v.data(), v.size()), &code) && code >= 0 && code <= 16
            ? code
            : static_cast<int>(StatusCode::UNKNOWN);
  } else if (n == "grpc-message") {
    call->grpc_message = PercentDecode(v);
  }
  return 0;
}

// A server stream's data: hands every whole message to the caller, keeps the rest.
void DeliverMessages(CallState* call, const uint8_t* data, size_t len) {
  call->body.append(reinterpret_cast<const char*>(data), len);
  while (!call->stopped && !call->too_large && !call->compressed) {
    const size_t left = call->body.size() - call->consumed;
    if (left < 5) break;
    const auto* b = reinterpret_cast<const unsigned char*>(call->body.data() + call->consumed);
    const uint64_t length =
        (uint64_t{b[1]} << 24) | (uint64_t{b[2]} << 16) | (uint64_t{b[3]} << 8) | uint64_t{b[4]};
    if (b[0] != 0) {
      call->compressed = true;
      break;
    }
    if (length > kWireMaxResponseBytes) {
      call->too_large = true;
      break;
    }
    if (left < 5 + length) break;
    const std::string_view message(call->body.data() + call->consumed + 5, length);
    call->consumed += 5 + length;
    if (!(*call->on_message)(message)) call->stopped = true;
  }
  // Drop what was delivered once it is most of the buffer, so a long stream stays small.
  if (call->consumed > 0 && call->consumed * 2 >= call->body.size()) {
    call->body.erase(0, call->consumed);
    call->consumed = 0;
  }
}

int OnDataChunk(nghttp2_session*, uint8_t, int32_t stream_id, const uint8_t* data, size_t len,
                void* user_data) {
  auto* call = static_cast<CallState*>(user_data);
  if (call == nullptr || stream_id != call->stream_id || call->too_large) return 0;
  if (call->on_message != nullptr) {
    DeliverMessages(call, data, len);
    return 0;
  }
  // One message and its 5-byte prefix at most; more is refused rather than buffered.
  if (call->body.size() + len > kWireMaxResponseBytes + 5) {
    call->too_large = true;
    call->body.clear();
    return 0;
  }
  call->body.append(reinterpret_cast<const char*>(data), len);
  return 0;
}

int OnStreamClose(nghttp2_session*, int32_t stream_id, uint32_t error_code, void* user_data) {
  auto* call = static_cast<CallState*>(user_data);
  if (call == nullptr || stream_id != call->stream_id) return 0;
  call->closed = true;
  call->reset_code = error_code;
  return 0;
}

ssize_t ReadRequest(nghttp2_session*, int32_t, uint8_t* buf, size_t length, uint32_t* data_flags,
                    nghttp2_data_source*, void* user_data) {
  auto* call = static_cast<CallState*>(user_data);
  const size_t n = std::min(length, call->request.size() - call->request_sent);
  std::memcpy(buf, call->request.data() + call->request_sent, n);
  call->request_sent += n;
  if (call->request_sent == call->request.size()) *data_flags |= NGHTTP2_DATA_FLAG_EOF;
  return static_cast<ssize_t>(n);
}

nghttp2_nv Header(std::string_view name, std::string_view value) {
  return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
                    reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(),
                    value.size(), NGHTTP2_NV_FLAG_NONE};
}

// A header value gRPC would send: visible ASCII and spaces only.
bool IsSendableHeaderValue(std::string_view v) {
  for (const char c : v) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

// Blocks SIGPIPE on this thread while OpenSSL writes to the socket (its socket BIO calls write(),
// not send() with MSG_NOSIGNAL), and discards one raised meanwhile: a server that hangs up is
// an error to report, not a signal that kills loomctl.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

// OpenSSL's queued errors as one line (and the queue emptied).
std::string OpenSslErrors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no detail" : out;
}

}  // namespace

struct WireClient::Session {
  int fd = -1;
  SSL_CTX* tls_ctx = nullptr;  // with `ssl`: the connection is TLS
  SSL* ssl = nullptr;
  nghttp2_session* h2 = nullptr;
  std::string out;  // what Flush is writing

  ~Session() {
    if (h2 != nullptr) nghttp2_session_del(h2);
    if (ssl != nullptr) SSL_free(ssl);
    if (tls_ctx != nullptr) SSL_CTX_free(tls_ctx);
    if (fd >= 0) ::close(fd);
  }

  // Moves bytes between the socket (or TLS on it) and memory. Both return the bytes moved (> 0),
  // 0 when the peer closed (Read), or -1 with *wait set to the poll events to wait for, or -2
  // with *error set.
  ssize_t Write(const char* data, size_t n, short* wait, std::string* error) {
    if (ssl == nullptr) {
      // MSG_NOSIGNAL: a closed peer is an error here, not a SIGPIPE that kills loomctl.
      const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
      if (w >= 0) return w;
      if (errno == EAGAIN || errno == EINTR) return *wait = POLLOUT, -1;
      *error = absl::StrCat("sending: ", std::strerror(errno));
      return -2;
    }
    SigpipeGuard guard;
    const int w = SSL_write(ssl, data, static_cast<int>(std::min<size_t>(n, 1 << 30)));
    return w > 0 ? w : TlsWait(w, wait, error, "sending");
  }
  ssize_t Read(uint8_t* buf, size_t n, short* wait, std::string* error) {
    if (ssl == nullptr) {
      const ssize_t r = ::recv(fd, buf, n, 0);
      if (r >= 0) return r;
      if (errno == EAGAIN || errno == EINTR) return *wait = POLLIN, -1;
      *error = absl::StrCat("receiving: ", std::strerror(errno));
      return -2;
    }
    SigpipeGuard guard;  // a read can write too (a TLS key update)
    const int r = SSL_read(ssl, buf, static_cast<int>(std::min<size_t>(n, 1 << 30)));
    if (r > 0) return r;
    if (SSL_get_error(ssl, r) == SSL_ERROR_ZERO_RETURN) return 0;
    return TlsWait(r, wait, error, "receiving");
  }
  ssize_t TlsWait(int rc, short* wait, std::string* error, const char* what) {
    switch (SSL_get_error(ssl, rc)) {
      case SSL_ERROR_WANT_READ:
        return *wait = POLLIN, -1;
      case SSL_ERROR_WANT_WRITE:
        return *wait = POLLOUT, -1;
      case SSL_ERROR_SYSCALL:
        if (ERR_peek_error() == 0) {
          *error = absl::StrCat(what, " over TLS: ", errno != 0 ? std::strerror(errno) : "EOF");
          return -2;
        }
        [[fallthrough]];
      default:
        *error = absl::StrCat(what, " over TLS: ", OpenSslErrors());
        return -2;
    }
  }

  // Sends everything nghttp2 has queued (frames and the request's data), gathered into one
  // write: each write to loopback wakes the server again.
  grpc::Status Flush(absl::Time deadline) {
    out.clear();
    for (;;) {
      const uint8_t* data = nullptr;
      const ssize_t n = nghttp2_session_mem_send(h2, &data);
      if (n < 0) {
        return grpc::Status(StatusCode::INTERNAL,
                            absl::StrCat("HTTP/2: ", nghttp2_strerror(static_cast<int>(n))));
      }
      if (n == 0) break;
      out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
    }
    size_t sent = 0;
    while (sent < out.size()) {
      short wait = 0;
      std::string error;
      const ssize_t w = Write(out.data() + sent, out.size() - sent, &wait, &error);
      if (w > 0) {
        sent += static_cast<size_t>(w);
      } else if (w == -1 || w == 0) {
        if (!WaitFor(fd, wait != 0 ? wait : POLLOUT, deadline)) {
          return grpc::Status(StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
        }
      } else {
        return grpc::Status(StatusCode::UNAVAILABLE, error);
      }
    }
    return grpc::Status::OK;
  }

  // The TLS handshake on `fd`: verifies the server's certificate against `tls.ca` and its name
  // against `host` (a DNS name, or an IP address checked against the certificate's IP
  // entries), presents tls.cert/tls.key when given, and agrees on HTTP/2 (ALPN "h2").
  grpc::Status StartTls(const WireTls& tls, const std::string& host, absl::Time deadline) {
    tls_ctx = SSL_CTX_new(TLS_client_method());
    if (tls_ctx == nullptr) {
      return grpc::Status(StatusCode::INTERNAL, absl::StrCat("TLS: ", OpenSslErrors()));
    }
    SSL_CTX_set_min_proto_version(tls_ctx, TLS1_2_VERSION);
    // The first group of the list is the one the ClientHello carries a key share for. gRPC's
    // server accepts only P-256 (its SSL_CTX_set_tmp_ecdh), so with OpenSSL's default order
    // (X25519 first) every handshake took a HelloRetryRequest: a second round trip, a second
    // key generation here and a second ClientHello for loomd to parse. X25519 stays offered.
    if (SSL_CTX_set1_groups_list(tls_ctx, "P-256:X25519:P-384") != 1) {
      return grpc::Status(StatusCode::INTERNAL, absl::StrCat("TLS: ", OpenSslErrors()));
    }
    SSL_CTX_set_verify(tls_ctx, SSL_VERIFY_PEER, nullptr);
    if (tls.ca.empty()) {
      if (SSL_CTX_set_default_verify_paths(tls_ctx) != 1) {
        return grpc::Status(StatusCode::FAILED_PRECONDITION,
                            absl::StrCat("TLS: cannot load the system's trusted certificates (",
                                         OpenSslErrors(), "); give the server's CA with --tls-ca"));
      }
    } else if (SSL_CTX_load_verify_locations(tls_ctx, tls.ca.c_str(), nullptr) != 1) {
      return grpc::Status(
          StatusCode::FAILED_PRECONDITION,
          absl::StrCat("--tls-ca: cannot load \"", tls.ca, "\": ", OpenSslErrors()));
    }
    if (!tls.cert.empty()) {
      if (SSL_CTX_use_certificate_chain_file(tls_ctx, tls.cert.c_str()) != 1 ||
          SSL_CTX_use_PrivateKey_file(tls_ctx, tls.key.c_str(), SSL_FILETYPE_PEM) != 1 ||
          SSL_CTX_check_private_key(tls_ctx) != 1) {
        return grpc::Status(StatusCode::FAILED_PRECONDITION,
                            absl::StrCat("--tls-cert/--tls-key: cannot use \"", tls.cert,
                                         "\" with \"", tls.key, "\": ", OpenSslErrors()));
      }
    }
    static constexpr unsigned char kAlpn[] = {2, 'h', '2'};
    if (SSL_CTX_set_alpn_protos(tls_ctx, kAlpn, sizeof(kAlpn)) != 0) {  // 0 is success here
      return grpc::Status(StatusCode::INTERNAL, absl::StrCat("TLS: ", OpenSslErrors()));
    }
    ssl = SSL_new(tls_ctx);
    if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
      return grpc::Status(StatusCode::INTERNAL, absl::StrCat("TLS: ", OpenSslErrors()));
    }
    unsigned char ip[16];
    const bool is_ip =
        ::inet_pton(AF_INET, host.c_str(), ip) == 1 || ::inet_pton(AF_INET6, host.c_str(), ip) == 1;
    const int named = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host.c_str())
                            : SSL_set_tlsext_host_name(ssl, host.c_str()) == 1 &&
                                  SSL_set1_host(ssl, host.c_str()) == 1;
    if (named != 1) {
      return grpc::Status(StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("TLS: cannot check the server's name \"", host, "\""));
    }
    for (;;) {
      SigpipeGuard guard;
      ERR_clear_error();
      const int rc = SSL_connect(ssl);
      if (rc == 1) break;
      short wait = 0;
      std::string error;
      if (TlsWait(rc, &wait, &error, "the TLS handshake") == -2) {
        const long verify = SSL_get_verify_result(ssl);
        if (verify != X509_V_OK) {
          error = absl::StrCat("the TLS handshake: the server's certificate is not trusted for \"",
                               host, "\": ", X509_verify_cert_error_string(verify));
        }
        return grpc::Status(StatusCode::UNAVAILABLE, error);
      }
      if (!WaitFor(fd, wait, deadline)) {
        return grpc::Status(StatusCode::DEADLINE_EXCEEDED,
                            "Deadline Exceeded during the TLS handshake");
      }
    }
    const unsigned char* proto = nullptr;
    unsigned int proto_len = 0;
    SSL_get0_alpn_selected(ssl, &proto, &proto_len);
    if (proto_len != 2 || std::memcmp(proto, "h2", 2) != 0) {
      return grpc::Status(StatusCode::UNAVAILABLE,
                          "the TLS server did not agree to HTTP/2 (ALPN h2); is it loomd?");
    }
    return grpc::Status::OK;
  }
};

WireClient::WireClient(std::string server, std::string token, std::optional<WireTls> tls)
    : server_(std::move(server)), token_(std::move(token)), tls_(std::move(tls)) {}

WireClient::WireClient(int connected_fd, std::string server, std::string token,
                       std::optional<WireTls> tls)
    : server_(std::move(server)),
      token_(std::move(token)),
      tls_(std::move(tls)),
      adopted_fd_(connected_fd) {}

WireClient::~WireClient() {
  if (adopted_fd_ >= 0) ::close(adopted_fd_);
}

grpc::Status WireClient::Connect(absl::Time deadline) {
  absl::StatusOr<HostPort> hp = ParseHostPort(server_);
  if (!hp.ok())
    return grpc::Status(StatusCode::INVALID_ARGUMENT, std::string(hp.status().message()));
  if (adopted_fd_ != -1) {
    if (adopted_fd_ == -2) {
      return grpc::Status(StatusCode::UNAVAILABLE, "the connection to " + server_ + " is gone");
    }
    const int fd = adopted_fd_;
    adopted_fd_ = -2;
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    return StartSession(fd, hp->host, deadline);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(hp->port);
  if (const int rc = ::getaddrinfo(hp->host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return grpc::Status(StatusCode::UNAVAILABLE,
                        absl::StrCat("cannot resolve ", hp->host, ": ", ::gai_strerror(rc)));
  }
  std::string last_error = "no address";
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      if (!WaitFor(fd, POLLOUT, deadline)) {
        ::close(fd);
        ::freeaddrinfo(found);
        return grpc::Status(StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded while connecting");
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc != 0) {
      last_error = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    return grpc::Status(StatusCode::UNAVAILABLE,
                        absl::StrCat("failed to connect to ", server_, ": ", last_error));
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return StartSession(fd, hp->host, deadline);
}

grpc::Status WireClient::StartSession(int fd, const std::string& host, absl::Time deadline) {
  auto session = std::make_unique<Session>();
  session->fd = fd;
  if (tls_.has_value()) {
    if (grpc::Status s = session->StartTls(*tls_, host, deadline); !s.ok()) return s;
  }
  nghttp2_session_callbacks* callbacks = nullptr;
  if (nghttp2_session_callbacks_new(&callbacks) != 0) {
    return grpc::Status(StatusCode::RESOURCE_EXHAUSTED, "HTTP/2: out of memory");
  }
  nghttp2_session_callbacks_set_on_header_callback(callbacks, OnHeader);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, OnDataChunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, OnStreamClose);
  // The callbacks' user data is the call in progress, set per call (nghttp2_session_set_user_data).
  const int rc = nghttp2_session_client_new(&session->h2, callbacks, nullptr);
  nghttp2_session_callbacks_del(callbacks);
  if (rc != 0) return grpc::Status(StatusCode::RESOURCE_EXHAUSTED, "HTTP/2: out of memory");
  // Windows large enough that a 64 MiB answer never waits for a WINDOW_UPDATE round trip; no
  // server push.
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, kWireMaxResponseBytes + 1024},
  };
  if (nghttp2_submit_settings(session->h2, NGHTTP2_FLAG_NONE, settings, 2) != 0 ||
      nghttp2_session_set_local_window_size(session->h2, NGHTTP2_FLAG_NONE, 0,
                                            kWireMaxResponseBytes + 1024) != 0) {
    return grpc::Status(StatusCode::INTERNAL, "HTTP/2: cannot set the connection's settings");
  }
  session_ = std::move(session);
  return grpc::Status::OK;
}

namespace {

// A request buffer of `size` message bytes after gRPC's 5-byte prefix (not compressed, the
// length big-endian), the message itself left to the caller.
absl::StatusOr<std::string> FramedRequest(size_t size) {
  if (size > 0xffffffffu) return absl::InvalidArgumentError("the request is larger than 4 GiB");
  std::string framed(5 + size, '\0');
  for (int i = 0; i < 4; ++i) framed[1 + i] = static_cast<char>((size >> (24 - 8 * i)) & 0xff);
  return framed;
}

// `request` serialized after gRPC's 5-byte prefix, into `*framed`.
grpc::Status FrameMessage(const google::protobuf::MessageLite& request, std::string* framed) {
  const size_t size = request.ByteSizeLong();
  absl::StatusOr<std::string> buffer = FramedRequest(size);
  if (!buffer.ok()) {
    return grpc::Status(StatusCode::INVALID_ARGUMENT, std::string(buffer.status().message()));
  }
  if (!request.SerializeToArray(buffer->data() + 5, static_cast<int>(size))) {
    return grpc::Status(StatusCode::INTERNAL, "cannot serialize the request");
  }
  *framed = *std::move(buffer);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status WireClient::Call(std::string_view path, const google::protobuf::MessageLite& request,
                              google::protobuf::MessageLite* response, absl::Time deadline) {
  std::string framed;
  if (grpc::Status f = FrameMessage(request, &framed); !f.ok()) return f;
  std::string body;
  grpc::Status status = Exchange(path, std::move(framed), deadline, token_, &body);
  if (!status.ok()) return status;
  if (!response->ParseFromArray(body.data() + 5, static_cast<int>(body.size() - 5))) {
    return grpc::Status(StatusCode::INTERNAL, "cannot parse the answer's message");
  }
  return grpc::Status::OK;
}

grpc::Status WireClient::CallSerialized(std::string_view path, std::string_view request,
                                        std::string* response, absl::Time deadline,
                                        std::string_view token) {
  absl::StatusOr<std::string> framed = FramedRequest(request.size());
  if (!framed.ok()) {
    return grpc::Status(StatusCode::INVALID_ARGUMENT, std::string(framed.status().message()));
  }
  if (!request.empty()) std::memcpy(framed->data() + 5, request.data(), request.size());
  std::string body;
  grpc::Status status = Exchange(path, *std::move(framed), deadline, token, &body);
  if (status.ok()) response->assign(body, 5, std::string::npos);
  return status;
}

grpc::Status WireClient::CallStream(std::string_view path,
                                    const google::protobuf::MessageLite& request,
                                    absl::FunctionRef<bool(std::string_view)> on_message,
                                    absl::Time deadline) {
  std::string framed;
  if (grpc::Status f = FrameMessage(request, &framed); !f.ok()) return f;
  std::string unused;
  return Exchange(path, std::move(framed), deadline, token_, &unused, &on_message);
}

int WireClient::session_fd() const { return session_ == nullptr ? -1 : session_->fd; }

void WireClient::DropSessionIfClosed() {
  if (session_ == nullptr) return;
  Session& s = *session_;
  pollfd p{s.fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0 && (s.ssl == nullptr || SSL_pending(s.ssl) == 0)) return;
  // Something came while nobody read: a GOAWAY or EOF (the server shut down or restarted), a
  // PING, or TLS session tickets. nghttp2 takes it (a PING's acknowledgement goes out with the
  // next call); a session that can take no more streams is closed.
  uint8_t buf[16 << 10];
  for (;;) {
    short wait = 0;
    std::string error;
    const ssize_t n = s.Read(buf, sizeof(buf), &wait, &error);
    if (n == -1) break;  // drained
    if (n <= 0 || nghttp2_session_mem_recv(s.h2, buf, static_cast<size_t>(n)) < 0) {
      session_.reset();
      return;
    }
  }
  if (!nghttp2_session_want_read(s.h2)) session_.reset();
}

grpc::Status WireClient::Exchange(std::string_view path, std::string framed_request,
                                  absl::Time deadline, std::string_view token,
                                  std::string* framed_answer,
                                  absl::FunctionRef<bool(std::string_view)>* on_message) {
  if (!IsSendableHeaderValue(token)) {
    return grpc::Status(StatusCode::INVALID_ARGUMENT,
                        "the bearer token has a character that cannot be sent in a header "
                        "(control or non-ASCII); check the token file or LOOM_TOKEN");
  }
  if (absl::Now() >= deadline)
    return grpc::Status(StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
  DropSessionIfClosed();
  if (session_ == nullptr) {
    if (grpc::Status s = Connect(deadline); !s.ok()) return s;
  }
  CallState call;
  call.request = std::move(framed_request);
  call.on_message = on_message;

  const std::string timeout = GrpcTimeoutHeader(deadline - absl::Now());
  const std::string bearer = token.empty() ? "" : absl::StrCat("Bearer ", std::string(token));
  std::vector<nghttp2_nv> headers = {
      Header(":method", "POST"),
      Header(":scheme", tls_.has_value() ? "https" : "http"),
      Header(":path", path),
      Header(":authority", server_),
      Header("te", "trailers"),
      Header("content-type", "application/grpc"),
      Header("user-agent", "loomctl-wire"),
  };
  // A call without a deadline (a stream) sends none: the server then sets none either.
  if (deadline != absl::InfiniteFuture()) headers.push_back(Header("grpc-timeout", timeout));
  if (!bearer.empty()) headers.push_back(Header("authorization", bearer));
  nghttp2_data_provider body{};
  body.read_callback = ReadRequest;

  Session& s = *session_;
  nghttp2_session_set_user_data(s.h2, &call);
  // Whatever happens below, the callbacks must not see `call` after it is gone, and a
  // connection that failed is not used again.
  grpc::Status result = [&]() -> grpc::Status {
    call.stream_id =
        nghttp2_submit_request(s.h2, nullptr, headers.data(), headers.size(), &body, &call);
    if (call.stream_id < 0) {
      return grpc::Status(StatusCode::UNAVAILABLE,
                          absl::StrCat("HTTP/2: ", nghttp2_strerror(call.stream_id)));
    }
    uint8_t buf[16 << 10];
    while (!call.closed && !call.stopped) {
      if (grpc::Status f = s.Flush(deadline); !f.ok()) return f;
      if (!nghttp2_session_want_read(s.h2) && !nghttp2_session_want_write(s.h2)) {
        return grpc::Status(StatusCode::UNAVAILABLE, "the server ended the HTTP/2 connection");
      }
      // Read first, then wait: TLS may hold decrypted bytes the socket no longer shows.
      short wait = 0;
      std::string error;
      const ssize_t n = s.Read(buf, sizeof(buf), &wait, &error);
      if (n == 0) {
        return grpc::Status(StatusCode::UNAVAILABLE, "the server closed the connection");
      }
      if (n == -1) {
        if (!WaitFor(s.fd, wait, deadline)) {
          return grpc::Status(StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
        }
        continue;
      }
      if (n < 0) return grpc::Status(StatusCode::UNAVAILABLE, error);
      const ssize_t used = nghttp2_session_mem_recv(s.h2, buf, static_cast<size_t>(n));
      if (used < 0) {
        return grpc::Status(
            StatusCode::UNAVAILABLE,
            absl::StrCat("the server at ", server_, " does not speak HTTP/2 as gRPC does (",
                         nghttp2_strerror(static_cast<int>(used)), ")"));
      }
    }
    if (call.stopped && !call.closed) {
      // The caller wants no more of the stream: cancel it, as gRPC's TryCancel does.
      nghttp2_submit_rst_stream(s.h2, NGHTTP2_FLAG_NONE, call.stream_id, NGHTTP2_CANCEL);
      if (grpc::Status f = s.Flush(deadline); !f.ok()) return f;
    }
    return grpc::Status::OK;
  }();
  nghttp2_session_set_user_data(s.h2, nullptr);
  if (!result.ok()) {
    session_.reset();
    return result;
  }
  // Frames the answer asked for (SETTINGS and PING acknowledgements, WINDOW_UPDATE) go out
  // with the next call; a connection that cannot take more streams is opened again.
  if (!nghttp2_session_want_read(s.h2) || nghttp2_session_get_next_stream_id(s.h2) > (1u << 30)) {
    session_.reset();
  }

  if (call.too_large) {
    return grpc::Status(
        StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("the answer is larger than ", kWireMaxResponseBytes, " bytes"));
  }
  if (call.compressed) {
    return grpc::Status(StatusCode::INTERNAL, "the answer is compressed, which was not asked for");
  }
  if (call.stopped) return grpc::Status::OK;
  if (call.grpc_status.has_value() && *call.grpc_status != 0) {
    return grpc::Status(static_cast<StatusCode>(*call.grpc_status), call.grpc_message);
  }
  if (!call.grpc_status.has_value()) {
    if (call.http_status == 0) {  // the stream ended before any answer: a transport failure
      return grpc::Status(CodeForReset(call.reset_code, StatusCode::UNAVAILABLE),
                          absl::StrCat("the call ended before an answer (HTTP/2: ",
                                       nghttp2_http2_strerror(call.reset_code), ")"));
    }
    if (call.http_status != 200) {
      return grpc::Status(CodeForHttpStatus(call.http_status),
                          absl::StrCat("the server answered HTTP ", call.http_status,
                                       " without a gRPC status; is it loomd?"));
    }
    if (!absl::StartsWith(call.content_type, "application/grpc")) {
      return grpc::Status(StatusCode::UNKNOWN,
                          absl::StrCat("the server answered with content-type \"",
                                       call.content_type, "\"; is it loomd?"));
    }
    if (call.reset_code != NGHTTP2_NO_ERROR) {
      return grpc::Status(CodeForReset(call.reset_code, StatusCode::INTERNAL),
                          absl::StrCat("the server reset the call (HTTP/2: ",
                                       nghttp2_http2_strerror(call.reset_code), ")"));
    }
    return grpc::Status(StatusCode::INTERNAL, "the answer ended without a grpc-status");
  }
  if (on_message != nullptr) {
    if (call.body.size() > call.consumed) {
      return grpc::Status(StatusCode::INTERNAL, "the stream ended inside a message");
    }
    return grpc::Status::OK;
  }
  // Exactly one uncompressed message (this client asks for no compression).
  if (call.body.size() < 5) {
    return grpc::Status(StatusCode::INTERNAL, "the answer has no message");
  }
  const auto* b = reinterpret_cast<const unsigned char*>(call.body.data());
  const uint64_t length =
      (uint64_t{b[1]} << 24) | (uint64_t{b[2]} << 16) | (uint64_t{b[3]} << 8) | uint64_t{b[4]};
  if (b[0] != 0) {
    return grpc::Status(StatusCode::INTERNAL, "the answer is compressed, which was not asked for");
  }
  if (length != call.body.size() - 5) {
    return grpc::Status(StatusCode::INTERNAL, "the answer is not exactly one message");
  }
  *framed_answer = std::move(call.body);
  return grpc::Status::OK;
}

std::string GrpcTimeoutHeader(absl::Duration remaining) {
  // At most 8 digits per unit: milliseconds up to 27 hours, then whole seconds (rounded up).
  const int64_t ms = std::max<int64_t>(absl::ToInt64Milliseconds(remaining), 1);
  if (ms <= 99'999'999) return absl::StrCat(ms, "m");
  const int64_t seconds = ms / 1000 + (ms % 1000 != 0 ? 1 : 0);
  return absl::StrCat(std::min<int64_t>(seconds, 99'999'999), "S");
}

std::string PercentDecode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    int hi = 0, lo = 0;
    auto hex = [](char c, int* v) {
      if (c >= '0' && c <= '9')
        *v = c - '0';
      else if (c >= 'a' && c <= 'f')
        *v = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        *v = c - 'A' + 10;
      else
        return false;
      return true;
    };
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1], &hi) && hex(s[i + 2], &lo)) {
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

}  // namespace loom::client
