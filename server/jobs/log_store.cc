#include "server/jobs/log_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "google/protobuf/util/time_util.h"

namespace loom::jobs {
namespace {

constexpr char kFileName[] = "output.log";

absl::Status MakeDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InternalError(
        absl::StrCat("cannot create log directory ", dir, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// One stored line, see the layout in the header.
std::string FormatLine(int64_t generation, int rank, std::string_view stream, std::string_view node,
                       absl::Time time, std::string_view text) {
  std::string clean(text.substr(0, kMaxLineBytes));
  for (char& c : clean) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  return absl::StrCat(generation, "\t", rank, "\t", std::string(stream), "\t", std::string(node),
                      "\t", absl::ToUnixMicros(time), "\t", clean, "\n");
}

// Parses one stored line (without its LF); false for a line that is not in the layout (a torn
// write after a crash), which readers skip.
bool ParseLine(std::string_view raw, v1::LogLine* out) {
  const absl::string_view line(raw.data(), raw.size());
  std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits('\t', 5));
  if (fields.size() != 6) return false;
  int64_t generation = 0;
  int rank = 0;
  int64_t micros = 0;
  if (!absl::SimpleAtoi(fields[0], &generation) || !absl::SimpleAtoi(fields[1], &rank) ||
      !absl::SimpleAtoi(fields[4], &micros)) {
    return false;
  }
  out->set_generation(generation);
  out->set_rank(rank);
  out->set_stream(std::string(fields[2]));
  out->set_node(std::string(fields[3]));
  *out->mutable_time() = google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(micros);
  out->set_text(std::string(fields[5]));
  return true;
}

absl::Status WriteAll(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

bool IsSafeJobId(std::string_view id) {
  if (id.empty() || id.size() > 63 || id[0] == '-') return false;
  for (char c : id) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<LogStore>> LogStore::Open(const std::string& dir,
                                                         int64_t max_bytes_per_job) {
  RETURN_IF_ERROR(MakeDir(dir));
  return std::unique_ptr<LogStore>(new LogStore(dir, max_bytes_per_job));
}

LogStore::LogStore(std::string dir, int64_t max_bytes_per_job)
    : dir_(std::move(dir)), max_bytes_per_job_(max_bytes_per_job) {}

std::string LogStore::PathOf(std::string_view job_id) const {
  return absl::StrCat(dir_, "/", std::string(job_id), "/", kFileName);
}

LogStore::JobLog& LogStore::LogOf(std::string_view job_id) {
  auto it = logs_.find(job_id);
  if (it == logs_.end()) it = logs_.emplace(std::string(job_id), JobLog{}).first;
  JobLog& log = it->second;
  if (!log.loaded) {
    struct stat st;
    if (::stat(PathOf(job_id).c_str(), &st) == 0) {
      log.size = st.st_size;
      log.truncated = log.size >= max_bytes_per_job_;
    }
    log.loaded = true;
  }
  return log;
}

absl::Status LogStore::Append(std::string_view job_id, const v1::LogChunk& chunk,
                              std::string_view node, absl::Time now) {
  if (!IsSafeJobId(job_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id \"", std::string(job_id), "\" is not valid"));
  }
  if (chunk.lines().empty()) return absl::OkStatus();
  std::vector<std::function<void()>> wake;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    status = AppendLocked(job_id, chunk, node, now, &wake);
  }
  for (const std::function<void()>& listener : wake) listener();
  return status;
}

absl::Status LogStore::AppendLocked(std::string_view job_id, const v1::LogChunk& chunk,
                                    std::string_view node, absl::Time now,
                                    std::vector<std::function<void()>>* wake) {
  const std::string stream = chunk.stream() == "stderr" ? "stderr" : "stdout";
  JobLog& log = LogOf(job_id);
  if (log.truncated) return absl::OkStatus();
  std::string data;
  for (const std::string& text : chunk.lines()) {
    std::string line = FormatLine(chunk.generation(), chunk.rank(), stream, node, now, text);
    if (log.size + static_cast<int64_t>(data.size() + line.size()) > max_bytes_per_job_) {
      absl::StrAppend(
          &data,
          FormatLine(chunk.generation(), -1, "loom", "", now,
                     absl::StrCat("[loom] log truncated: this job's log reached ",
                                  max_bytes_per_job_ >> 20, " MiB; later lines are dropped")));
      log.truncated = true;
      break;
    }
    data += line;
  }
  const std::string job_dir = absl::StrCat(dir_, "/", std::string(job_id));
  RETURN_IF_ERROR(MakeDir(job_dir));
  const std::string path = PathOf(job_id);
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  absl::Status status = WriteAll(fd, data, path);
  ::close(fd);
  // Re-read the size on error so that readers never wait for bytes that were not written.
  if (!status.ok()) {
    log.loaded = false;
    LogOf(job_id);
  } else {
    log.size += static_cast<int64_t>(data.size());
  }
  grew_.SignalAll();
  if (auto it = listeners_.find(job_id); it != listeners_.end()) {
    for (const auto& [id, listener] : it->second) wake->push_back(listener);
  }
  return status;
}

uint64_t LogStore::AddListener(std::string_view job_id, std::function<void()> listener) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_listener_++;
  auto it = listeners_.find(job_id);
  if (it == listeners_.end()) it = listeners_.emplace(std::string(job_id), Listeners()).first;
  it->second.emplace(id, std::move(listener));
  return id;
}

void LogStore::RemoveListener(std::string_view job_id, uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = listeners_.find(job_id);
  if (it == listeners_.end()) return;
  it->second.erase(id);
  if (it->second.empty()) listeners_.erase(it);
}

absl::StatusOr<LogBatch> LogStore::Read(std::string_view job_id, int64_t offset,
                                        std::optional<int> rank, int64_t max_bytes) {
  if (!IsSafeJobId(job_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id \"", std::string(job_id), "\" is not valid"));
  }
  if (offset < 0) return absl::InvalidArgumentError("log offset must be >= 0");
  LogBatch batch;
  batch.next_offset = offset;
  const std::string path = PathOf(job_id);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return batch;
    return absl::InternalError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  std::string buffer(static_cast<size_t>(std::max<int64_t>(max_bytes, kMaxLineBytes + 256)), '\0');
  ssize_t n;
  do {
    n = ::pread(fd, buffer.data(), buffer.size(), offset);
  } while (n < 0 && errno == EINTR);
  const int saved_errno = errno;
  ::close(fd);
  if (n < 0) {
    return absl::InternalError(
        absl::StrCat("cannot read ", path, ": ", std::strerror(saved_errno)));
  }
  std::string_view data(buffer.data(), static_cast<size_t>(n));
  size_t pos = 0;
  while (true) {
    const size_t end = data.find('\n', pos);
    if (end == std::string_view::npos) break;  // an incomplete line: read it next time
    v1::LogLine line;
    if (ParseLine(data.substr(pos, end - pos), &line) &&
        (!rank.has_value() || line.rank() == *rank || line.rank() < 0)) {
      batch.lines.push_back(std::move(line));
    }
    pos = end + 1;
  }
  batch.next_offset = offset + static_cast<int64_t>(pos);
  return batch;
}

bool LogStore::WaitForMore(std::string_view job_id, int64_t offset, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (!shutdown_) {
    if (LogOf(job_id).size > offset) return true;
    if (grew_.WaitWithDeadline(&mu_, deadline)) break;
  }
  return !shutdown_ && LogOf(job_id).size > offset;
}

void LogStore::Shutdown() {
  std::vector<std::function<void()>> wake;
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    grew_.SignalAll();
    for (const auto& [job, listeners] : listeners_) {
      for (const auto& [id, listener] : listeners) wake.push_back(listener);
    }
  }
  for (const std::function<void()>& listener : wake) listener();
}

}  // namespace loom::jobs
