#include "common/net.h"

#include <charconv>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loom {
namespace {

absl::Status Bad(std::string_view s, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid address \"", std::string(s), "\": ", std::string(why),
                   "; expected HOST:PORT such as 127.0.0.1:50051, [::1]:50051 or localhost:50051"));
}

bool IsHostNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_';
}

bool IsIpv6LiteralChar(char c) {
  return (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || (c >= '0' && c <= '9') || c == ':' ||
         c == '.';  // '.' for v4-mapped forms such as ::ffff:127.0.0.1
}

}  // namespace

absl::StatusOr<HostPort> ParseHostPort(std::string_view s) {
  if (s.empty()) return Bad(s, "it is empty");
  std::string_view host;
  std::string_view port;
  if (s.front() == '[') {
    const size_t close = s.find(']');
    if (close == std::string_view::npos) return Bad(s, "'[' without a closing ']'");
    host = s.substr(1, close - 1);
    if (host.empty()) return Bad(s, "the host is empty");
    // An address, optionally followed by a zone ("fe80::1%eth0") whose name is free-form.
    const size_t zone = host.find('%');
    const std::string_view addr = host.substr(0, zone);
    const std::string_view zone_name =
        zone == std::string_view::npos ? std::string_view() : host.substr(zone + 1);
    bool ok = addr.find(':') != std::string_view::npos;
    for (char c : addr) ok = ok && IsIpv6LiteralChar(c);
    for (char c : zone_name) ok = ok && IsHostNameChar(c);
    if (zone != std::string_view::npos && zone_name.empty()) ok = false;
    if (!ok) {
      return Bad(s, "the bracketed host is not an IPv6 address");
    }
    const std::string_view rest = s.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return Bad(s, "the port is missing after ']'");
    port = rest.substr(1);
  } else {
    const size_t colon = s.rfind(':');
    if (colon == std::string_view::npos) return Bad(s, "the port is missing");
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return Bad(s, "an IPv6 host must be in brackets");
    }
    if (host.empty()) return Bad(s, "the host is empty");
    for (char c : host) {
      if (!IsHostNameChar(c)) return Bad(s, "the host contains characters not allowed there");
    }
    if (host.front() == '-' || host.front() == '.') {
      return Bad(s, "the host must start with a letter or digit");
    }
  }
  if (port.empty()) return Bad(s, "the port is empty");
  if (port.size() > 5) return Bad(s, "the port must be a number from 0 to 65535");
  int value = 0;
  const auto r = std::from_chars(port.data(), port.data() + port.size(), value);
  if (r.ec != std::errc() || r.ptr != port.data() + port.size() || value < 0 || value > 65535) {
    return Bad(s, "the port must be a number from 0 to 65535");
  }
  return HostPort{std::string(host), value};
}

std::string FormatHostPort(std::string_view host, int port) {
  if (host.find(':') != std::string_view::npos)
    return absl::StrCat("[", std::string(host), "]:", port);
  return absl::StrCat(std::string(host), ":", port);
}

std::string FormatHostPort(const HostPort& hp) { return FormatHostPort(hp.host, hp.port); }

}  // namespace loom
