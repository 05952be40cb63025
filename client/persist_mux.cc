#include "client/persist_mux.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/rpc_paths.h"

namespace loom::client {
namespace {

using grpc::StatusCode;

constexpr char kRequestTag[4] = {'L', 'M', 'X', 'q'};
constexpr char kAnswerTag[4] = {'L', 'M', 'X', 'a'};
// The largest payloads a reader accepts: a request's fields at their bounds; an answer of the
// largest message the wire accepts.
constexpr size_t kMaxRequestPayload =
    kMuxMaxKeyBytes + kMuxMaxPathBytes + kMuxMaxTokenBytes + kMuxMaxRequestBodyBytes + 64;
constexpr size_t kMaxAnswerPayload = kMuxMaxMessageBytes + kWireMaxResponseBytes + 64;
// Idle connections to loomd a mux keeps; calls beyond it use a connection of their own.
constexpr size_t kMaxPooledConnections = 64;

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutI64(std::string* out, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}
void PutBytes(std::string* out, std::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}

// Reads the payload of a frame, field by field, each checked against what is left.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  bool U32(uint32_t* v) {
    if (data_.size() < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= uint32_t{static_cast<uint8_t>(data_[i])} << (8 * i);
    data_.remove_prefix(4);
    return true;
  }
  bool I64(int64_t* v) {
    if (data_.size() < 8) return false;
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= uint64_t{static_cast<uint8_t>(data_[i])} << (8 * i);
    data_.remove_prefix(8);
    *v = static_cast<int64_t>(u);
    return true;
  }
  bool Bytes(size_t max, std::string* out) {
    uint32_t n = 0;
    if (!U32(&n) || n > max || n > data_.size()) return false;
    out->assign(data_.substr(0, n));
    data_.remove_prefix(n);
    return true;
  }
  bool empty() const { return data_.empty(); }

 private:
  std::string_view data_;
};

std::string Frame(const char tag[4], const std::string& payload) {
  std::string out(tag, 4);
  PutU32(&out, static_cast<uint32_t>(payload.size()));
  return out + payload;
}

absl::StatusOr<std::string_view> Payload(std::string_view frame, const char tag[4],
                                         size_t max_payload) {
  if (frame.size() < 8 || frame.substr(0, 4) != std::string_view(tag, 4)) {
    return absl::InvalidArgumentError("not a frame of this version of the persistent connection");
  }
  Reader header(frame.substr(4, 4));
  uint32_t n = 0;
  header.U32(&n);
  if (n > max_payload || n != frame.size() - 8) {
    return absl::InvalidArgumentError("the frame's length does not match its payload");
  }
  return frame.substr(8);
}

// Sends all of `data` (no SIGPIPE); false when the peer is gone.
bool SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

enum class ReadResult { kOk, kClosed, kTimeout, kBad };

// Reads one whole frame with tag `tag` (at most `max_payload` after the header) until
// `deadline`, on a blocking or non-blocking socket.
ReadResult ReadFrame(int fd, const char tag[4], size_t max_payload, absl::Time deadline,
                     std::string* frame) {
  frame->clear();
  size_t want = 8;
  char buf[64 << 10];
  while (frame->size() < want) {
    const int64_t wait_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (wait_ms <= 0) return ReadResult::kTimeout;
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(wait_ms, 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return ready == 0 ? ReadResult::kTimeout : ReadResult::kClosed;
    const ssize_t n = ::recv(fd, buf, std::min(sizeof(buf), want - frame->size()), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return ReadResult::kClosed;
    frame->append(buf, static_cast<size_t>(n));
    if (want == 8 && frame->size() == 8) {
      if (frame->compare(0, 4, tag, 4) != 0) return ReadResult::kBad;
      Reader header(std::string_view(*frame).substr(4, 4));
      uint32_t payload = 0;
      header.U32(&payload);
      if (payload > max_payload) return ReadResult::kBad;
      want = 8 + payload;
    }
  }
  return ReadResult::kOk;
}

uint64_t Fnv1a64(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (const char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 1099511628211ull;
  }
  return h;
}

// A file's identity for the key: its path, device, inode, size and modification time.
absl::StatusOr<std::string> FileIdentity(const std::string& path, const char* what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": cannot examine \"", path, "\": ", std::strerror(errno)));
  }
  return absl::StrCat(path, ":", st.st_dev, ":", st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec,
                      ".", st.st_mtim.tv_nsec);
}

bool FillUnixAddress(const std::string& path, sockaddr_un* address) {
  *address = sockaddr_un{};
  address->sun_family = AF_UNIX;
  if (path.size() >= sizeof(address->sun_path)) return false;
  std::memcpy(address->sun_path, path.data(), path.size());
  return true;
}

// A connected socket to the mux at `path`, or -1 (errno set).
int ConnectUnix(const std::string& path) {
  sockaddr_un address;
  if (!FillUnixAddress(path, &address)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

// Starts `loomctl --persist-mux ...` detached: a session of its own, not a child of this
// process (so that no shell or test waits for it), its stdio on /dev/null, and as fd 3 the write
// end of a pipe whose read end this returns (-1 when no process could be started): the mux
// writes a byte there once it listens, and a mux that cannot serve closes it without one.
// Everything the children use is prepared before the fork: this process may have threads.
int SpawnMux(const PersistTarget& target, const std::string& socket_path, const std::string& key) {
  std::vector<std::string> args = {
      "loomctl", "--persist-mux", socket_path,
      key,       target.server,   absl::StrCat(absl::ToInt64Milliseconds(target.idle)),
      "3"};
  if (target.tls.has_value()) {
    args.push_back(target.tls->ca);
    args.push_back(target.tls->cert);
    args.push_back(target.tls->key);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Not the caller's environment, which may hold LOOM_TOKEN: only what OpenSSL reads (its
  // configuration and certificate locations), so that the mux verifies as a direct call would.
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.rfind("OPENSSL_", 0) == 0 || entry.rfind("SSL_CERT_", 0) == 0)
      env.emplace_back(entry);
  }
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) return -1;
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(ready[0]);
    ::close(ready[1]);
    return -1;
  }
  if (child == 0) {
    ::setsid();
    if (::fork() != 0) _exit(0);
    // Never the caller's stdio: a pipe held open would keep a shell or a test waiting.
    const int null = ::open("/dev/null", O_RDWR);
    if (null < 0 || ::dup2(null, 0) != 0 || ::dup2(null, 1) != 1 || ::dup2(null, 2) != 2) {
      _exit(127);
    }
    // As fd 3, open across the exec (dup2 onto itself would keep close-on-exec: cleared here).
    if (::dup2(ready[1], 3) != 3 || ::fcntl(3, F_SETFD, 0) != 0) _exit(127);
    ::close_range(4, ~0U, 0);
    if (::chdir("/") != 0) _exit(127);
    ::execve("/proc/self/exe", argv.data(), envp.data());
    _exit(127);
  }
  ::close(ready[1]);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return ready[0];
}

// Whether a call left the mark `path` less than kAutoPersistWindow ago; leaves this call's mark
// either way (the file's modification time). The mark is created in the private directory,
// never through a link.
bool CalledRecently(const std::string& path) {
  struct stat st;
  const absl::Time now = absl::Now();
  bool recent = false;
  if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    const absl::Time marked = absl::TimeFromTimespec(st.st_mtim);
    recent = marked <= now && now - marked < kAutoPersistWindow;
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd >= 0) {
    ::futimens(fd, nullptr);
    ::close(fd);
  }
  return recent;
}

// Waits until the mux behind `ready` (SpawnMux) listens (true) or ends without (false), or
// `until` passes (false). Closes `ready`.
bool WaitForMux(int ready, absl::Time until) {
  bool listening = false;
  for (;;) {
    const int64_t wait_ms = absl::ToInt64Milliseconds(until - absl::Now());
    if (wait_ms <= 0) break;
    pollfd p{ready, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(wait_ms, 1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char byte = 0;
    listening = ::read(ready, &byte, 1) == 1;
    break;
  }
  ::close(ready);
  return listening;
}

}  // namespace

std::string EncodeMuxRequest(const MuxRequest& r) {
  std::string payload;
  PutBytes(&payload, r.key);
  PutBytes(&payload, r.path);
  PutBytes(&payload, r.token);
  PutI64(&payload, r.deadline_unix_ms);
  PutBytes(&payload, r.body);
  return Frame(kRequestTag, payload);
}

std::string EncodeMuxAnswer(const MuxAnswer& a) {
  std::string payload;
  PutU32(&payload, static_cast<uint32_t>(a.code));
  PutBytes(&payload, a.message);
  PutBytes(&payload, a.body);
  return Frame(kAnswerTag, payload);
}

absl::StatusOr<MuxRequest> DecodeMuxRequest(std::string_view frame) {
  absl::StatusOr<std::string_view> payload = Payload(frame, kRequestTag, kMaxRequestPayload);
  if (!payload.ok()) return payload.status();
  Reader r(*payload);
  MuxRequest out;
  if (!r.Bytes(kMuxMaxKeyBytes, &out.key) || !r.Bytes(kMuxMaxPathBytes, &out.path) ||
      !r.Bytes(kMuxMaxTokenBytes, &out.token) || !r.I64(&out.deadline_unix_ms) ||
      !r.Bytes(kMuxMaxRequestBodyBytes, &out.body) || !r.empty()) {
    return absl::InvalidArgumentError("a field of the request frame is out of bounds");
  }
  return out;
}

absl::StatusOr<MuxAnswer> DecodeMuxAnswer(std::string_view frame) {
  absl::StatusOr<std::string_view> payload = Payload(frame, kAnswerTag, kMaxAnswerPayload);
  if (!payload.ok()) return payload.status();
  Reader r(*payload);
  MuxAnswer out;
  uint32_t code = 0;
  if (!r.U32(&code) || !r.Bytes(kMuxMaxMessageBytes, &out.message) ||
      !r.Bytes(kWireMaxResponseBytes, &out.body) || !r.empty()) {
    return absl::InvalidArgumentError("a field of the answer frame is out of bounds");
  }
  out.code = static_cast<int32_t>(code);
  if (out.code != kMuxRefused && (out.code < 0 || out.code > StatusCode::UNAUTHENTICATED)) {
    return absl::InvalidArgumentError(absl::StrCat("the answer's code ", out.code, " is unknown"));
  }
  return out;
}

bool MuxRelays(std::string_view path) {
  return path == rpc::kCreateJob || path == rpc::kGetJob || path == rpc::kListJobs ||
         path == rpc::kCancelJob;
}

absl::StatusOr<std::string> PersistDirectory() {
  const uid_t uid = ::geteuid();
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  const std::string dir = runtime != nullptr && runtime[0] == '/' ? absl::StrCat(runtime, "/loom")
                                                                  : absl::StrCat("/tmp/loom-", uid);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create \"", dir, "\": ", std::strerror(errno)));
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot examine \"", dir, "\": ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != uid || (st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("\"", dir, "\" is not a private directory of user ", uid, " (",
                     S_ISDIR(st.st_mode) ? "a directory" : "not a directory", ", owner ", st.st_uid,
                     ", mode 0", (st.st_mode >> 6) & 7, (st.st_mode >> 3) & 7, st.st_mode & 7,
                     "); remove it, or set XDG_RUNTIME_DIR to a directory of your own"));
  }
  return dir;
}

absl::StatusOr<std::string> PersistKey(const PersistTarget& target) {
  std::string key = absl::StrCat("loom-persist-1\nserver=", target.server, "\n");
  absl::StatusOr<std::string> exe = FileIdentity("/proc/self/exe", "loomctl");
  if (!exe.ok()) return exe.status();
  absl::StrAppend(&key, "exe=", *exe, "\n");
  if (target.tls.has_value()) {
    const std::pair<const char*, const std::string*> files[] = {{"--tls-ca", &target.tls->ca},
                                                                {"--tls-cert", &target.tls->cert},
                                                                {"--tls-key", &target.tls->key}};
    for (const auto& [what, path] : files) {
      if (path->empty()) {
        absl::StrAppend(&key, what, "=\n");
        continue;
      }
      absl::StatusOr<std::string> id = FileIdentity(*path, what);
      if (!id.ok()) return id.status();
      absl::StrAppend(&key, what, "=", *id, "\n");
    }
  } else {
    absl::StrAppend(&key, "plaintext\n");
  }
  if (key.size() > kMuxMaxKeyBytes) {
    return absl::InvalidArgumentError(
        "the server address and TLS paths are too long for --persist");
  }
  return key;
}

std::optional<grpc::Status> CallThroughMux(const PersistTarget& target, std::string_view path,
                                           std::string_view request, std::string_view token,
                                           absl::Time deadline, bool retry_safe,
                                           std::string* response, std::string* note) {
  note->clear();
  if (!MuxRelays(path) || token.size() > kMuxMaxTokenBytes ||
      request.size() > kMuxMaxRequestBodyBytes) {
    return std::nullopt;  // the direct call gives the error, if any
  }
  absl::StatusOr<std::string> dir = PersistDirectory();
  if (!dir.ok()) {
    *note = absl::StrCat("--persist: ", dir.status().message(), "; calling loomd directly");
    return std::nullopt;
  }
  // The TLS files by absolute path: the mux runs from "/", and serves callers in any directory.
  PersistTarget absolute = target;
  if (absolute.tls.has_value()) {
    for (std::string* file : {&absolute.tls->ca, &absolute.tls->cert, &absolute.tls->key}) {
      std::error_code ec;
      if (!file->empty()) *file = std::filesystem::absolute(*file, ec).string();
      if (ec) return std::nullopt;
    }
  }
  absl::StatusOr<std::string> key = PersistKey(absolute);
  if (!key.ok()) return std::nullopt;
  // The socket, and the mark of the last direct call (automatic mode), are named by the key.
  const std::string stem = absl::StrCat(*dir, "/mux-", absl::Hex(Fnv1a64(*key), absl::kZeroPad16));
  const std::string socket_path = stem + ".sock";
  sockaddr_un unused;
  if (!FillUnixAddress(socket_path, &unused)) {
    *note = absl::StrCat("--persist: the socket path \"", socket_path,
                         "\" is too long for a Unix socket; set XDG_RUNTIME_DIR to a shorter "
                         "directory; calling loomd directly");
    return std::nullopt;
  }

  int fd = ConnectUnix(socket_path);
  const bool no_mux = fd < 0 && (errno == ENOENT || errno == ECONNREFUSED);
  if (no_mux && target.automatic && !CalledRecently(stem + ".recent")) {
    return std::nullopt;  // no loop (yet): this call goes directly, and leaves its mark
  }
  if (no_mux) {
    // The mux listens a few milliseconds after its start, or says at once that it cannot; past
    // a second (or the call's deadline), the call is made directly.
    const int ready = SpawnMux(absolute, socket_path, *key);
    if (ready >= 0 && WaitForMux(ready, std::min(deadline, absl::Now() + absl::Seconds(1)))) {
      fd = ConnectUnix(socket_path);
    }
  }
  if (fd < 0) return std::nullopt;

  MuxRequest r;
  r.key = *key;
  r.path = std::string(path);
  r.token = std::string(token);
  r.deadline_unix_ms = absl::ToUnixMillis(deadline);
  r.body = std::string(request);
  if (!SendAll(fd, EncodeMuxRequest(r))) {
    ::close(fd);
    return std::nullopt;  // the mux took nothing: it is closing
  }
  std::string frame;
  // A little past the call's deadline: the mux answers DEADLINE_EXCEEDED itself then.
  const ReadResult read =
      ReadFrame(fd, kAnswerTag, kMaxAnswerPayload, deadline + absl::Seconds(2), &frame);
  ::close(fd);
  absl::StatusOr<MuxAnswer> answer =
      read == ReadResult::kOk ? DecodeMuxAnswer(frame) : absl::UnavailableError("no answer");
  if (!answer.ok()) {
    if (read == ReadResult::kTimeout) {
      return grpc::Status(StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
    }
    if (retry_safe) return std::nullopt;
    return grpc::Status(
        StatusCode::UNAVAILABLE,
        "loomctl's persistent connection to loomd (--persist, or the automatic one over TLS; 0 "
        "turns it off) ended before loomd's answer: the call may or may not have been made; "
        "check with `loomctl get`");
  }
  if (answer->code == kMuxRefused) return std::nullopt;
  if (answer->code == 0) *response = std::move(answer->body);
  return grpc::Status(static_cast<StatusCode>(answer->code), answer->message);
}

// ---- The mux ----------------------------------------------------------------------------------

namespace {

// The mux's connections to loomd that no call is using. Thread-safe.
class ConnectionPool {
 public:
  ConnectionPool(std::string server, std::optional<WireTls> tls)
      : server_(std::move(server)), tls_(std::move(tls)) {
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) wake_[0] = wake_[1] = -1;
  }
  ~ConnectionPool() {
    for (const int fd : wake_) {
      if (fd >= 0) ::close(fd);
    }
  }
  // Readable when a connection came back to the pool since the last DrainWake(): the main
  // loop's poll must add its socket.
  int wake_fd() const { return wake_[0]; }
  void DrainWake() {
    char buf[64];
    while (wake_[0] >= 0 && ::read(wake_[0], buf, sizeof(buf)) > 0) {
    }
  }

  std::unique_ptr<WireClient> Take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        std::unique_ptr<WireClient> c = std::move(idle_.back());
        idle_.pop_back();
        return c;
      }
    }
    return std::make_unique<WireClient>(server_, "", tls_);
  }
  void Return(std::unique_ptr<WireClient> c) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (idle_.size() >= kMaxPooledConnections) return;
      idle_.push_back(std::move(c));
    }
    if (wake_[1] >= 0) (void)!::write(wake_[1], "w", 1);  // a full pipe already wakes it
  }
  // For the main loop's poll: each idle connection's socket (-1: none open).
  std::vector<int> IdleFds() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<int> fds;
    for (const auto& c : idle_) fds.push_back(c->session_fd());
    return fds;
  }
  // An idle connection whose socket is readable: takes what loomd sent (a PING, a GOAWAY at
  // its shutdown) and closes the session when loomd ended it, so that loomd's graceful
  // shutdown does not wait for this mux.
  void Refresh(int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& c : idle_) {
      if (c->session_fd() == fd) c->DropSessionIfClosed();
    }
  }

 private:
  const std::string server_;
  const std::optional<WireTls> tls_;
  std::mutex mu_;
  std::vector<std::unique_ptr<WireClient>> idle_;
  int wake_[2] = {-1, -1};
};

// The most calls a mux serves at once; more wait for a thread.
constexpr int kMaxMuxThreads = 64;

struct MuxState {
  std::string key;
  ConnectionPool* pool = nullptr;
  std::atomic<int> active{0};            // accepted calls not answered yet
  std::atomic<int64_t> last_call_ms{0};  // unix ms of the latest call's end (or the start)
  // Accepted sockets waiting for a thread, and the threads: started when a call finds none
  // waiting, up to kMaxMuxThreads, kept until the process ends (thread starts cost about as much
  // as a relayed call on a small VM).
  std::mutex mu;
  std::condition_variable ready;
  std::deque<int> queue;  // guarded by mu
  int threads = 0;        // guarded by mu
  int waiting = 0;        // threads blocked on `ready`; guarded by mu
};

void ServeOne(MuxState* state, int fd) {
  std::string frame;
  const ReadResult read =
      ReadFrame(fd, kRequestTag, kMaxRequestPayload, absl::Now() + absl::Seconds(10), &frame);
  MuxAnswer answer;
  absl::StatusOr<MuxRequest> request =
      read == ReadResult::kOk ? DecodeMuxRequest(frame) : absl::InvalidArgumentError("no frame");
  if (!request.ok() || request->key != state->key || !MuxRelays(request->path)) {
    answer.code = kMuxRefused;
    answer.message = !request.ok()                ? std::string(request.status().message())
                     : request->key != state->key ? "another mux's call"
                                                  : "a call this mux does not relay";
  } else {
    // The caller's deadline, at most an hour away whatever it says.
    const absl::Time deadline =
        std::min(absl::FromUnixMillis(request->deadline_unix_ms), absl::Now() + absl::Hours(1));
    std::unique_ptr<WireClient> client = state->pool->Take();
    grpc::Status status = client->CallSerialized(request->path, request->body, &answer.body,
                                                 deadline, request->token);
    state->pool->Return(std::move(client));
    answer.code = status.error_code();
    answer.message = status.error_message().substr(0, kMuxMaxMessageBytes);
    if (!status.ok()) answer.body.clear();
  }
  SendAll(fd, EncodeMuxAnswer(answer));
  ::close(fd);
  state->last_call_ms.store(absl::ToUnixMillis(absl::Now()));
  state->active.fetch_sub(1);
}

// Accepts every pending connection of `listener` (non-blocking) and starts its call.
void AcceptAll(MuxState* state, int listener) {
  for (;;) {
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN: none left (or an error, which the next poll shows again)
    }
    ucred peer{};
    socklen_t len = sizeof(peer);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.uid != ::geteuid()) {
      ::close(fd);
      continue;
    }
    state->active.fetch_add(1);
    std::lock_guard<std::mutex> lock(state->mu);
    state->queue.push_back(fd);
    if (state->waiting > 0) {
      state->ready.notify_one();
    } else if (state->threads < kMaxMuxThreads) {
      ++state->threads;
      std::thread([state] {
        std::unique_lock<std::mutex> lock(state->mu);
        for (;;) {
          ++state->waiting;
          state->ready.wait(lock, [state] { return !state->queue.empty(); });
          --state->waiting;
          const int next = state->queue.front();
          state->queue.pop_front();
          lock.unlock();
          ServeOne(state, next);
          lock.lock();
        }
      }).detach();
    }
  }
}

}  // namespace

int RunPersistMux(int argc, char** argv) {
  // loomctl --persist-mux SOCKET KEY SERVER IDLE_MS READY_FD [CA CERT KEY_FILE]
  int64_t idle_ms = 0;
  int ready_fd = -1;
  if ((argc != 7 && argc != 10) || !absl::SimpleAtoi(argv[5], &idle_ms) || idle_ms <= 0 ||
      !absl::SimpleAtoi(argv[6], &ready_fd) || ready_fd < 3) {
    std::fprintf(stderr, "loomctl --persist-mux: started by loomctl --persist, not by hand\n");
    return 2;
  }
  // Tells the loomctl that started this process that it can connect (closing the pipe without
  // a byte, as every early return does at exit, says it cannot).
  const auto announce = [ready_fd] {
    (void)!::write(ready_fd, "1", 1);
    ::close(ready_fd);
  };
  const std::string socket_path = argv[2];
  std::optional<WireTls> tls;
  // The TLS files come only for a TLS server; an empty CA means the system's roots.
  if (argc == 10) tls = WireTls{argv[7], argv[8], argv[9]};
  ::signal(SIGPIPE, SIG_IGN);
  ::umask(077);

  sockaddr_un address;
  if (!FillUnixAddress(socket_path, &address)) return 1;
  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listener < 0) return 1;
  const auto* sa = reinterpret_cast<const sockaddr*>(&address);
  if (::bind(listener, sa, sizeof(address)) != 0) {
    if (errno != EADDRINUSE) return 1;
    // Another mux answers there (two calls started one each): it serves; this one ends.
    const int other = ConnectUnix(socket_path);
    if (other >= 0) {
      ::close(other);
      announce();
      return 0;
    }
    // A socket left by a mux that died: replaced.
    ::unlink(socket_path.c_str());
    if (::bind(listener, sa, sizeof(address)) != 0) return 1;
  }
  struct stat bound {};
  if (::lstat(socket_path.c_str(), &bound) != 0 || ::listen(listener, 256) != 0) return 1;
  announce();

  // Never destroyed: the serving threads wait on them until the process ends (std::_Exit below).
  ConnectionPool& pool = *new ConnectionPool(argv[4], tls);
  MuxState& state = *new MuxState;
  state.key = argv[3];
  state.pool = &pool;
  state.last_call_ms.store(absl::ToUnixMillis(absl::Now()));
  const absl::Duration idle = absl::Milliseconds(idle_ms);
  for (;;) {
    pool.DrainWake();
    std::vector<pollfd> fds = {{listener, POLLIN, 0}, {pool.wake_fd(), POLLIN, 0}};
    for (const int fd : pool.IdleFds()) {
      if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    }
    const absl::Duration left =
        absl::FromUnixMillis(state.last_call_ms.load()) + idle - absl::Now();
    if (state.active.load() == 0 && left <= absl::ZeroDuration()) break;
    // Wakes at least once a second, when idle time may have run out.
    const int timeout_ms =
        static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1, 1000));
    if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) continue;
    if (fds[0].revents != 0) AcceptAll(&state, listener);
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents != 0) pool.Refresh(fds[i].fd);
    }
  }
  // Idle: no new caller can reach this mux once its name is gone (only if the name is still
  // this mux's socket); callers already queued are served, then the process ends.
  struct stat now {};
  if (::lstat(socket_path.c_str(), &now) == 0 && now.st_ino == bound.st_ino &&
      now.st_dev == bound.st_dev) {
    ::unlink(socket_path.c_str());
  }
  AcceptAll(&state, listener);
  while (state.active.load() > 0) ::usleep(1000);
  ::close(listener);
  // Without static destructors: the serving threads still wait on `state`.
  std::_Exit(0);
}

}  // namespace loom::client
