// The per-rank trace ring: every phase a rank measures (per micro-batch forward and backward,
// each collective, waits, optimizer, data loading), recorded every step as fixed-size records in
// a bounded ring that lives in a memory-mapped file (LOOM_TRACE_FILE, docs/rank-contract.md).
// The rank writes it; loom-worker reads it when loomd asks for a job's timeline (`loomctl
// trace`), so nothing travels while nobody looks.
//
// File layout (little-endian, what the hosts Loom runs on use):
//   TraceFileHeader (64 bytes), then `capacity` TraceRecords (64 bytes each).
//   Record i (0-based, counting every record ever written) lives in slot i % capacity. The
//   header's `written` is the number of records completely written.
//
// Writing (one thread, the training thread): a record's `seq` is set to 0, its fields are
// written, then `seq` = i + 1 and then `written` = i + 1, each store with release order. A rank
// killed in the middle leaves a slot whose seq does not match (a torn record).
//
// Reading (another process, at any time): the reader copies the file, reads `written` before
// (w0) and after (w1, from a second read of the header) and keeps record i only when
// w1 - capacity <= i < w0 (so the writer cannot have overwritten it during the copy) and its
// slot's seq is i + 1. Every field is checked; a bad header or record is skipped with a note,
// never trusted: the file is written by the user's rank program.
//
// Time: start_ns is CLOCK_REALTIME in nanoseconds since the Unix epoch, so that ranks on
// different nodes land on one timeline (as well as the hosts' clocks agree: exact on one host,
// usually within a millisecond under NTP, off by whatever the clock error is otherwise).
// Durations come from CLOCK_MONOTONIC; the recorder converts monotonic instants to real time
// through an anchor taken at the start of every step, so a clock step by NTP moves a whole step,
// never stretches a phase.
//
// Error regime: the writer belongs to the training core but never stops training: a ring that
// cannot be created turns tracing off with one line on stderr (TraceRecorder::Open). The reader
// is shared with loom-worker (control plane): it throws nothing and returns notes.
#ifndef LOOM_WORKER_TRAIN_PROFILER_TRACE_RING_H_
#define LOOM_WORKER_TRAIN_PROFILER_TRACE_RING_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::train {

// What a record measured. The numbers are the wire's too (loom.v1.TraceEventKind): keep them
// equal (tests/train/trace_ring_test.cc checks the names, the worker maps by number).
enum class TraceKind : uint16_t {
  kStep = 1,                // the whole optimizer step
  kData = 2,                // drawing a micro-batch's tokens
  kForward = 3,             // a micro-batch's forward on this stage
  kBackward = 4,            // a micro-batch's backward on this stage
  kOptimizer = 5,           // clipping, AdamW (and the gradient norm on a lone rank)
  kPpRecvActivation = 6,    // waiting for a micro-batch's input activations (bubble)
  kPpRecvGradient = 7,      // waiting for the gradient of a micro-batch's output (bubble)
  kPpSendWait = 8,          // waiting for an earlier send to leave before reusing its buffer
  kPipelineDrain = 9,       // the end-of-step barrier of the pipeline (bubble)
  kDpBucketAllReduce = 10,  // one gradient bucket's all-reduce, on the communication thread
  kDpWait = 11,             // waiting for the buckets after backward (exposed communication)
  kEmbAllReduce = 12,       // the tied embedding's gradient between first and last stage
  kWorldAllReduce = 13,     // the step's loss, gradient norm and stop flag
  kTpAllReduce = 14,        // a tensor-parallel all-reduce inside a block
  kZeroReduceScatter = 15,  // ZeRO-1's gradient reduce-scatter
  kZeroAllGather = 16,      // ZeRO-1's parameter all-gather
  kMax = kZeroAllGather,
};

// "step", "data", "forward", ... ("?" for a number outside the enum).
const char* TraceKindName(uint16_t kind);

inline constexpr char kTraceMagic[8] = {'L', 'O', 'O', 'M', 'T', 'R', 'C', '1'};
inline constexpr uint32_t kTraceVersion = 1;
// 64 Ki records of 64 bytes: a 4 MiB file per rank, tens of steps of a big pipeline.
inline constexpr uint32_t kDefaultTraceCapacity = 64 * 1024;
// What a reader accepts at most (a hostile header cannot make it read more).
inline constexpr uint32_t kMaxTraceCapacity = 1024 * 1024;

struct TraceFileHeader {
  char magic[8];         // kTraceMagic
  uint32_t version;      // kTraceVersion
  uint32_t record_size;  // sizeof(TraceRecord)
  uint32_t capacity;     // records in the ring
  int32_t rank;          // LOOM_RANK of the writer
  int64_t generation;    // LOOM_JOB_GENERATION of the writer
  uint64_t written;      // records completely written so far (release store)
  uint8_t reserved[24];
};
static_assert(sizeof(TraceFileHeader) == 64);

struct TraceRecord {
  uint64_t seq;      // index + 1 once complete; 0 while being written
  int64_t start_ns;  // CLOCK_REALTIME, ns since the Unix epoch
  int64_t dur_ns;    // >= 0
  int64_t step;      // the optimizer step it belongs to (1-based)
  uint64_t bytes;    // bytes moved by a collective; 0 otherwise
  int32_t micro;     // micro-batch index, -1 when not per micro-batch
  int32_t aux;       // the peer rank (pp), the bucket index (dp), the block (tp); -1 none
  uint16_t kind;     // TraceKind
  uint16_t reserved0;
  uint32_t reserved1;
  uint64_t reserved2;
};
static_assert(sizeof(TraceRecord) == 64);

// The writer's side: the ring in a memory-mapped file.
class TraceRing {
 public:
  // Creates (or truncates) `path` with room for `capacity` records. Returns nullptr and sets
  // `error` (with errno's text) when the file cannot be made.
  static TraceRing* Create(const std::string& path, uint32_t capacity, int32_t rank,
                           int64_t generation, std::string* error);
  ~TraceRing();
  TraceRing(const TraceRing&) = delete;
  TraceRing& operator=(const TraceRing&) = delete;

  // Appends one record (the seq protocol above).
  void Append(TraceKind kind, int64_t start_ns, int64_t dur_ns, int64_t step, int32_t micro,
              uint64_t bytes, int32_t aux);
  uint64_t written() const;
  uint32_t capacity() const { return capacity_; }

 private:
  TraceRing(void* map, size_t size, uint32_t capacity);
  void* map_;
  size_t size_;
  uint32_t capacity_;
  TraceFileHeader* header_;
  TraceRecord* records_;
  uint64_t next_ = 0;
};

// What a reader got out of a ring file.
struct TraceReadResult {
  bool ok = false;  // the header was valid (records may still have been skipped)
  int32_t rank = -1;
  int64_t generation = 0;
  uint64_t written = 0;
  std::vector<TraceRecord> records;  // valid records in write order
  uint64_t torn = 0;                 // slots whose seq did not match (torn or overwritten)
  uint64_t invalid = 0;              // records with a bad kind, duration or step
  std::vector<std::string> notes;    // why something was skipped
};

// Parses a ring from the bytes of its file. `written_after` is the header's `written` read
// again after the bytes were copied (equal to the copy's own when the file did not move).
// Never reads outside `data`.
TraceReadResult ParseTraceRing(const void* data, size_t size, uint64_t written_after);

// Reads the ring file at `path` (at most `max_bytes`; a larger file is refused with a note).
// Never throws; an unreadable file is ok = false with a note.
TraceReadResult ReadTraceFile(const std::string& path, size_t max_bytes);

}  // namespace loom::train

#endif  // LOOM_WORKER_TRAIN_PROFILER_TRACE_RING_H_
