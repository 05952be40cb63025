#include "worker/train/profiler/trace_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace loom::train {
namespace {

constexpr const char* kKindNames[] = {"?",
                                      "step",
                                      "data",
                                      "forward",
                                      "backward",
                                      "optimizer",
                                      "pp_recv_activation",
                                      "pp_recv_gradient",
                                      "pp_send_wait",
                                      "pipeline_drain",
                                      "dp_bucket_all_reduce",
                                      "dp_wait",
                                      "emb_all_reduce",
                                      "world_all_reduce",
                                      "tp_all_reduce",
                                      "zero_reduce_scatter",
                                      "zero_all_gather"};
static_assert(sizeof(kKindNames) / sizeof(kKindNames[0]) ==
              static_cast<size_t>(TraceKind::kMax) + 1);

// A record whose fields a viewer could not place: a kind outside the enum, a negative or
// absurd duration (over a day), a step outside [1, 2^40).
bool Plausible(const TraceRecord& r) {
  constexpr int64_t kDayNs = int64_t{86400} * 1000 * 1000 * 1000;
  return r.kind >= 1 && r.kind <= static_cast<uint16_t>(TraceKind::kMax) && r.dur_ns >= 0 &&
         r.dur_ns <= kDayNs && r.start_ns > 0 && r.step >= 1 && r.step < (int64_t{1} << 40) &&
         r.micro >= -1;
}

uint64_t LoadWritten(const TraceFileHeader& h) {
  uint64_t w;
  std::memcpy(&w, &h.written, sizeof(w));
  return w;
}

}  // namespace

const char* TraceKindName(uint16_t kind) {
  if (kind < 1 || kind > static_cast<uint16_t>(TraceKind::kMax)) return kKindNames[0];
  return kKindNames[kind];
}

TraceRing* TraceRing::Create(const std::string& path, uint32_t capacity, int32_t rank,
                             int64_t generation, std::string* error) {
  if (capacity == 0 || capacity > kMaxTraceCapacity) {
    *error = "trace capacity " + std::to_string(capacity) + " is outside [1, " +
             std::to_string(kMaxTraceCapacity) + "]";
    return nullptr;
  }
  const size_t size = sizeof(TraceFileHeader) + size_t{capacity} * sizeof(TraceRecord);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    *error = "cannot create " + path + ": " + std::strerror(errno);
    return nullptr;
  }
  // The blocks are reserved now: a store into a mapped page the file system cannot back (a full
  // disk under a sparse file) would kill the rank with SIGBUS in the middle of a step.
  if (const int e = ::posix_fallocate(fd, 0, static_cast<off_t>(size)); e != 0) {
    *error =
        "cannot reserve " + std::to_string(size) + " bytes for " + path + ": " + std::strerror(e);
    ::close(fd);
    return nullptr;
  }
  void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    *error = "cannot map " + path + ": " + std::strerror(map_errno);
    return nullptr;
  }
  auto* ring = new TraceRing(map, size, capacity);
  TraceFileHeader* h = ring->header_;
  std::memcpy(h->magic, kTraceMagic, sizeof(kTraceMagic));
  h->version = kTraceVersion;
  h->record_size = sizeof(TraceRecord);
  h->capacity = capacity;
  h->rank = rank;
  h->generation = generation;
  std::atomic_ref<uint64_t>(h->written).store(0, std::memory_order_release);
  return ring;
}

TraceRing::TraceRing(void* map, size_t size, uint32_t capacity)
    : map_(map),
      size_(size),
      capacity_(capacity),
      header_(static_cast<TraceFileHeader*>(map)),
      records_(reinterpret_cast<TraceRecord*>(static_cast<char*>(map) + sizeof(TraceFileHeader))) {}

TraceRing::~TraceRing() { ::munmap(map_, size_); }

void TraceRing::Append(TraceKind kind, int64_t start_ns, int64_t dur_ns, int64_t step,
                       int32_t micro, uint64_t bytes, int32_t aux) {
  TraceRecord& r = records_[next_ % capacity_];
  std::atomic_ref<uint64_t> seq(r.seq);
  seq.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  r.start_ns = start_ns;
  r.dur_ns = dur_ns < 0 ? 0 : dur_ns;
  r.step = step;
  r.bytes = bytes;
  r.micro = micro;
  r.aux = aux;
  r.kind = static_cast<uint16_t>(kind);
  r.reserved0 = 0;
  r.reserved1 = 0;
  r.reserved2 = 0;
  ++next_;
  seq.store(next_, std::memory_order_release);
  std::atomic_ref<uint64_t>(header_->written).store(next_, std::memory_order_release);
}

uint64_t TraceRing::written() const { return next_; }

TraceReadResult ParseTraceRing(const void* data, size_t size, uint64_t written_after) {
  TraceReadResult out;
  if (size < sizeof(TraceFileHeader)) {
    out.notes.push_back("the file is shorter than a trace header (" + std::to_string(size) +
                        " bytes)");
    return out;
  }
  TraceFileHeader h;
  std::memcpy(&h, data, sizeof(h));
  if (std::memcmp(h.magic, kTraceMagic, sizeof(kTraceMagic)) != 0) {
    out.notes.push_back("not a trace ring (bad magic)");
    return out;
  }
  if (h.version != kTraceVersion || h.record_size != sizeof(TraceRecord)) {
    out.notes.push_back("unsupported trace ring version " + std::to_string(h.version) +
                        " / record size " + std::to_string(h.record_size));
    return out;
  }
  if (h.capacity == 0 || h.capacity > kMaxTraceCapacity) {
    out.notes.push_back("trace ring capacity " + std::to_string(h.capacity) + " out of range");
    return out;
  }
  const size_t need = sizeof(TraceFileHeader) + size_t{h.capacity} * sizeof(TraceRecord);
  if (size < need) {
    out.notes.push_back("the file (" + std::to_string(size) + " bytes) is shorter than its " +
                        std::to_string(h.capacity) + " records need (" + std::to_string(need) +
                        ")");
    return out;
  }
  out.ok = true;
  out.rank = h.rank;
  out.generation = h.generation;
  const uint64_t w0 = LoadWritten(h);
  out.written = w0;
  // The writer only moves forward: an `after` below the copy's count is a rewritten file.
  const uint64_t w1 = written_after < w0 ? w0 : written_after;
  const uint64_t lo = w1 > h.capacity ? w1 - h.capacity : 0;
  const char* base = static_cast<const char*>(data) + sizeof(TraceFileHeader);
  if (w0 > lo) out.records.reserve(static_cast<size_t>(w0 - lo));
  for (uint64_t i = lo; i < w0; ++i) {
    TraceRecord r;
    std::memcpy(&r, base + (i % h.capacity) * sizeof(TraceRecord), sizeof(r));
    if (r.seq != i + 1) {
      ++out.torn;
      continue;
    }
    if (!Plausible(r)) {
      ++out.invalid;
      continue;
    }
    out.records.push_back(r);
  }
  if (out.torn > 0) {
    out.notes.push_back(std::to_string(out.torn) + " torn or overwritten record(s) skipped");
  }
  if (out.invalid > 0) {
    out.notes.push_back(std::to_string(out.invalid) +
                        " record(s) with an unknown kind or impossible time or step skipped");
  }
  return out;
}

TraceReadResult ReadTraceFile(const std::string& path, size_t max_bytes) {
  TraceReadResult out;
  // O_NOFOLLOW: the rank owns the directory and could plant a link to a file the worker may
  // read but the rank may not; O_NONBLOCK: a FIFO planted there must not hang the worker.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    out.notes.push_back(errno == ENOENT
                            ? "no trace file (the rank program records none)"
                            : std::string("cannot open the trace file: ") + std::strerror(errno));
    return out;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    out.notes.push_back("the trace file is not a regular file");
    return out;
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    out.notes.push_back("the trace file is " + std::to_string(st.st_size) + " bytes, over the " +
                        std::to_string(max_bytes) + " read at most");
    return out;
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::pread(fd, bytes.data() + got, bytes.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // shrunk under us: parse what we have
    got += static_cast<size_t>(n);
  }
  bytes.resize(got);
  // The count again, after the copy: records the writer may have overwritten meanwhile are
  // dropped (see the header comment).
  uint64_t after = 0;
  TraceFileHeader again;
  if (::pread(fd, &again, sizeof(again), 0) == static_cast<ssize_t>(sizeof(again))) {
    after = LoadWritten(again);
  }
  ::close(fd);
  return ParseTraceRing(bytes.data(), bytes.size(), after);
}

}  // namespace loom::train
