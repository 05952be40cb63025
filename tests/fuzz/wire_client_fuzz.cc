// Fuzz target: loomctl's wire client (client/wire_client.cc) reading what a server sends. The
// input is everything the "server" writes on its end of a socketpair before it closes: HTTP/2
// frames (nghttp2 parses them) whose headers, trailers and data the client turns into a gRPC
// status and a message, or for a server stream into messages handed over one by one. Its
// contract: whatever a peer sends, the call ends with a status (never a crash or a hang), OK only
// with a parsed answer, and the status code is one of gRPC's.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "absl/time/clock.h"
#include "client/wire_client.h"
#include "loom/v1/job.pb.h"

namespace {

// One call over a socketpair whose other end has written `data` and closed: unary (ListJobs) or,
// with `stream`, a server stream (StreamJobLogs), whose messages are parsed as they arrive.
void CallOnce(const uint8_t* data, size_t size, bool stream) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return;
  size_t written = 0;
  while (written < size) {
    const ssize_t n = ::write(sv[1], data + written, size - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  ::shutdown(sv[1], SHUT_WR);  // the client sees the end of the input as the server closing

  loom::client::WireClient client(sv[0], "fuzz-server:1", "token");
  const absl::Time start = absl::Now();
  grpc::Status status;
  if (stream) {
    loom::v1::StreamJobLogsRequest request;
    request.set_name("jobs/fuzz");
    int parsed = 0;
    status = client.CallStream(
        "/loom.v1.JobService/StreamJobLogs", request,
        [&](std::string_view bytes) {
          loom::v1::LogLine line;
          if (line.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) ++parsed;
          return parsed < 1000;  // a caller that has had enough cancels the stream
        },
        start + absl::Seconds(5));
  } else {
    loom::v1::ListJobsRequest request;
    request.set_page_size(10);
    loom::v1::ListJobsResponse response;
    status =
        client.Call("/loom.v1.JobService/ListJobs", request, &response, start + absl::Seconds(5));
  }
  const int code = static_cast<int>(status.error_code());
  if (code < 0 || code > 16) std::abort();  // not a gRPC status code
  // The input ends with the server closing, so the call never needs its deadline (a
  // DEADLINE_EXCEEDED the "server" sent as grpc-status is fine; waiting for it is a hang).
  if (absl::Now() - start >= absl::Seconds(4)) std::abort();
  ::close(sv[1]);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // What the client sends (its preface, the request, acknowledgements) stays in the socket's
  // buffer, unread; the input is kept small enough that neither side's writes can block.
  if (size > (32 << 10)) return 0;
  // The same bytes answer a unary call and a server stream: one corpus for both readers.
  CallOnce(data, size, /*stream=*/false);
  CallOnce(data, size, /*stream=*/true);
  return 0;
}
