#include "common/logging.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <string>

namespace loom {

LogMessage::LogMessage(LogLevel level, const char* file, int line) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() %
      1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char ts[32];
  std::strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
  const char* base = std::strrchr(file, '/');
  const char* tag = level == LogLevel::INFO ? "I" : level == LogLevel::WARNING ? "W" : "E";
  char millis_buf[8];
  std::snprintf(millis_buf, sizeof(millis_buf), ".%03dZ", millis);
  stream_ << tag << ' ' << ts << millis_buf << ' ' << (base ? base + 1 : file) << ':' << line
          << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string s = stream_.str();
  // One write(2) per line so that lines of concurrent threads never interleave.
  ssize_t unused = ::write(STDERR_FILENO, s.data(), s.size());
  (void)unused;
}

}  // namespace loom
