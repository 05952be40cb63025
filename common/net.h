// host:port parsing and formatting for every --listen / --coordinator style flag.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace loom {

struct HostPort {
  std::string host;  // without brackets: "127.0.0.1", "::1", "localhost"; never empty
  int port = 0;      // 0..65535; 0 asks the kernel for a free port when listening
};

// Parses "127.0.0.1:0", "[::1]:50051", "localhost:80", "0.0.0.0:9090". The host is an IPv4
// literal, a bracketed IPv6 literal or a DNS name; the port is decimal 0..65535. Anything else
// (missing port, unbracketed IPv6, empty host, junk characters) is INVALID_ARGUMENT with a message
// that quotes the bad value and shows the expected form.
absl::StatusOr<HostPort> ParseHostPort(std::string_view s);

// The inverse of ParseHostPort: brackets hosts that contain ':' (IPv6).
std::string FormatHostPort(std::string_view host, int port);
std::string FormatHostPort(const HostPort& hp);

}  // namespace loom
