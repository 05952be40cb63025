// LineSplitter: turns the bytes read from a rank's stdout, stderr or progress pipe into lines.
//
// Pipes deliver arbitrary chunks; a line may arrive in pieces or many lines in one read. Lines
// are bounded: a line longer than `max_line_bytes` is cut at that length and the rest of it (up
// to the next newline) is dropped, so one rank printing a megabyte without a newline cannot grow
// the worker's memory or produce a message loomd refuses. Every emitted line is valid UTF-8
// (invalid bytes become U+FFFD), because proto3 `string` fields must be UTF-8 and loomd would
// drop a whole LogChunk otherwise. A trailing '\r' is removed.
//
// Threading: not thread-safe; each pipe has its own splitter, used by the supervisor thread.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace loom::worker {

// Returns `in` with every byte sequence that is not well-formed UTF-8 replaced by U+FFFD.
std::string SanitizeUtf8(std::string_view in);

class LineSplitter {
 public:
  using LineCallback = std::function<void(std::string line)>;

  // `max_line_bytes` >= 1 bounds each emitted line (before UTF-8 repair, which may grow a line
  // by at most 3 bytes per invalid byte; callers size their batches with margin).
  explicit LineSplitter(size_t max_line_bytes);

  // Feeds bytes; calls `on_line` once per complete line, in order, without the newline.
  void Append(std::string_view bytes, const LineCallback& on_line);

  // At end of stream: emits the pending partial line, if any.
  void Flush(const LineCallback& on_line);

  // Lines cut because they exceeded the bound (for tests and diagnostics).
  size_t truncated_lines() const { return truncated_lines_; }

 private:
  void Emit(const LineCallback& on_line);

  const size_t max_line_bytes_;
  std::string pending_;     // the current line so far, at most max_line_bytes_
  bool discarding_ = false;  // true while dropping the tail of an over-long line
  size_t truncated_lines_ = 0;
};

}  // namespace loom::worker
