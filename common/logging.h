// Minimal thread-safe logging to stderr for the daemons and tools:
//   LOOM_LOG(INFO) << "listening on " << addr;
// One line per statement, prefixed with UTC time, level and source file:line.
#pragma once

#include <sstream>
#include <string_view>

namespace loom {

enum class LogLevel { INFO, WARNING, ERROR };

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // writes the line atomically
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace loom

#define LOOM_LOG(level) ::loom::LogMessage(::loom::LogLevel::level, __FILE__, __LINE__).stream()
