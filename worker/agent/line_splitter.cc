#include "worker/agent/line_splitter.h"

#include <algorithm>

namespace loom::worker {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed UTF-8 sequence starting at s[i], or 0 when it is malformed
// (overlong forms, surrogates and code points above U+10FFFF are malformed).
size_t ValidSequenceLength(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  }
  return n;
}

}  // namespace

std::string SanitizeUtf8(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  size_t i = 0;
  while (i < in.size()) {
    const size_t n = ValidSequenceLength(in, i);
    if (n == 0) {
      out.append(kReplacement);
      ++i;
    } else {
      out.append(in.substr(i, n));
      i += n;
    }
  }
  return out;
}

LineSplitter::LineSplitter(size_t max_line_bytes)
    : max_line_bytes_(std::max<size_t>(1, max_line_bytes)) {}

void LineSplitter::Append(std::string_view bytes, const LineCallback& on_line) {
  while (!bytes.empty()) {
    const size_t nl = bytes.find('\n');
    const std::string_view piece = bytes.substr(0, nl);
    if (!discarding_) {
      const size_t room = max_line_bytes_ - pending_.size();
      if (piece.size() > room) {
        pending_.append(piece.substr(0, room));
        discarding_ = true;
        ++truncated_lines_;
      } else {
        pending_.append(piece);
      }
    }
    if (nl == std::string_view::npos) return;
    Emit(on_line);
    bytes.remove_prefix(nl + 1);
  }
}

void LineSplitter::Flush(const LineCallback& on_line) {
  if (!pending_.empty() || discarding_) Emit(on_line);
}

void LineSplitter::Emit(const LineCallback& on_line) {
  if (!pending_.empty() && pending_.back() == '\r') pending_.pop_back();
  std::string line = SanitizeUtf8(pending_);
  pending_.clear();
  discarding_ = false;
  on_line(std::move(line));
}

}  // namespace loom::worker
