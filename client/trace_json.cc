#include "client/trace_json.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>

namespace loom::client {
namespace {

using loom::v1::TraceEvent;
using loom::v1::TraceEventKind;

constexpr int kStepsThread = 1;
constexpr int kBucketsThread = 2;

// A JSON string literal (quotes included) of `s`.
std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Nanoseconds as microseconds with three decimals (exact: no binary fraction on the way).
std::string Micros(int64_t ns) {
  char buf[32];
  const char* sign = ns < 0 ? "-" : "";
  const uint64_t a = ns < 0 ? -static_cast<uint64_t>(ns) : static_cast<uint64_t>(ns);
  std::snprintf(buf, sizeof(buf), "%s%" PRIu64 ".%03" PRIu64, sign, a / 1000, a % 1000);
  return buf;
}

// What the event's aux field is, by kind ("" : none).
const char* AuxName(TraceEventKind kind) {
  switch (kind) {
    case loom::v1::TRACE_EVENT_KIND_FORWARD:
    case loom::v1::TRACE_EVENT_KIND_BACKWARD:
      return "stage";
    case loom::v1::TRACE_EVENT_KIND_PP_RECV_ACTIVATION:
    case loom::v1::TRACE_EVENT_KIND_PP_RECV_GRADIENT:
    case loom::v1::TRACE_EVENT_KIND_PP_SEND_WAIT:
      return "peer_stage";
    case loom::v1::TRACE_EVENT_KIND_DP_BUCKET_ALL_REDUCE:
      return "bucket";
    default:
      return "";
  }
}

void WriteMetadata(std::ostream& out, const char* name, int pid, int tid, const std::string& arg,
                   const std::string& value, bool* first) {
  out << (*first ? "\n" : ",\n") << "{\"name\":\"" << name << "\",\"ph\":\"M\",\"pid\":" << pid
      << ",\"tid\":" << tid << ",\"args\":{\"" << arg << "\":" << value << "}}";
  *first = false;
}

void WriteEvent(std::ostream& out, const TraceEvent& e, int pid, int64_t origin, bool* first) {
  const TraceEventKind kind = e.kind();
  const int tid =
      kind == loom::v1::TRACE_EVENT_KIND_DP_BUCKET_ALL_REDUCE ? kBucketsThread : kStepsThread;
  out << (*first ? "\n" : ",\n") << "{\"name\":\"" << TraceEventName(kind) << "\",\"cat\":\""
      << TraceEventCategory(kind) << "\",\"ph\":\"X\",\"pid\":" << pid << ",\"tid\":" << tid
      << ",\"ts\":" << Micros(e.start_unix_nanos() - origin)
      << ",\"dur\":" << Micros(std::max<int64_t>(0, e.duration_nanos()))
      << ",\"args\":{\"step\":" << e.step();
  if (e.micro_batch() >= 0) out << ",\"micro_batch\":" << e.micro_batch();
  if (e.bytes() > 0) out << ",\"bytes\":" << e.bytes();
  const char* aux = AuxName(kind);
  if (*aux != '\0' && e.aux() >= 0) out << ",\"" << aux << "\":" << e.aux();
  out << "}}";
  *first = false;
}

}  // namespace

const char* TraceEventName(TraceEventKind kind) {
  switch (kind) {
    case loom::v1::TRACE_EVENT_KIND_STEP:
      return "step";
    case loom::v1::TRACE_EVENT_KIND_DATA:
      return "data";
    case loom::v1::TRACE_EVENT_KIND_FORWARD:
      return "forward";
    case loom::v1::TRACE_EVENT_KIND_BACKWARD:
      return "backward";
    case loom::v1::TRACE_EVENT_KIND_OPTIMIZER:
      return "optimizer";
    case loom::v1::TRACE_EVENT_KIND_PP_RECV_ACTIVATION:
      return "pp_recv_activation";
    case loom::v1::TRACE_EVENT_KIND_PP_RECV_GRADIENT:
      return "pp_recv_gradient";
    case loom::v1::TRACE_EVENT_KIND_PP_SEND_WAIT:
      return "pp_send_wait";
    case loom::v1::TRACE_EVENT_KIND_PIPELINE_DRAIN:
      return "pipeline_drain";
    case loom::v1::TRACE_EVENT_KIND_DP_BUCKET_ALL_REDUCE:
      return "dp_bucket_all_reduce";
    case loom::v1::TRACE_EVENT_KIND_DP_WAIT:
      return "dp_wait";
    case loom::v1::TRACE_EVENT_KIND_EMB_ALL_REDUCE:
      return "emb_all_reduce";
    case loom::v1::TRACE_EVENT_KIND_WORLD_ALL_REDUCE:
      return "world_all_reduce";
    case loom::v1::TRACE_EVENT_KIND_TP_ALL_REDUCE:
      return "tp_all_reduce";
    case loom::v1::TRACE_EVENT_KIND_ZERO_REDUCE_SCATTER:
      return "zero_reduce_scatter";
    case loom::v1::TRACE_EVENT_KIND_ZERO_ALL_GATHER:
      return "zero_all_gather";
    default:
      return "unknown";
  }
}

const char* TraceEventCategory(TraceEventKind kind) {
  switch (kind) {
    case loom::v1::TRACE_EVENT_KIND_STEP:
      return "step";
    case loom::v1::TRACE_EVENT_KIND_DATA:
    case loom::v1::TRACE_EVENT_KIND_FORWARD:
    case loom::v1::TRACE_EVENT_KIND_BACKWARD:
    case loom::v1::TRACE_EVENT_KIND_OPTIMIZER:
      return "compute";
    case loom::v1::TRACE_EVENT_KIND_PP_RECV_ACTIVATION:
    case loom::v1::TRACE_EVENT_KIND_PP_RECV_GRADIENT:
    case loom::v1::TRACE_EVENT_KIND_PP_SEND_WAIT:
    case loom::v1::TRACE_EVENT_KIND_PIPELINE_DRAIN:
      return "pp,wait";
    case loom::v1::TRACE_EVENT_KIND_DP_BUCKET_ALL_REDUCE:
      return "dp,collective";
    case loom::v1::TRACE_EVENT_KIND_DP_WAIT:
      return "dp,wait";
    case loom::v1::TRACE_EVENT_KIND_EMB_ALL_REDUCE:
    case loom::v1::TRACE_EVENT_KIND_WORLD_ALL_REDUCE:
    case loom::v1::TRACE_EVENT_KIND_ZERO_REDUCE_SCATTER:
    case loom::v1::TRACE_EVENT_KIND_ZERO_ALL_GATHER:
      return "collective,wait";
    case loom::v1::TRACE_EVENT_KIND_TP_ALL_REDUCE:
      return "tp,collective";
    default:
      return "unknown";
  }
}

void WriteTraceEventJson(const loom::v1::JobTrace& trace, std::ostream& out) {
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const loom::v1::RankTrace& r : trace.ranks()) {
    for (const TraceEvent& e : r.events()) origin = std::min(origin, e.start_unix_nanos());
  }
  if (origin == std::numeric_limits<int64_t>::max()) origin = 0;
  out << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"job\":" << Quote(trace.name())
      << ",\"generation\":" << trace.generation() << ",\"first_step\":" << trace.first_step()
      << ",\"last_step\":" << trace.last_step() << ",\"origin_unix_nanos\":" << origin
      << ",\"missing_nodes\":[";
  for (int i = 0; i < trace.missing_nodes_size(); ++i) {
    out << (i > 0 ? "," : "") << Quote(trace.missing_nodes(i));
  }
  out << "]},\"traceEvents\":[";
  bool first = true;
  for (const loom::v1::RankTrace& r : trace.ranks()) {
    const int pid = r.rank() + 1;
    const std::string name = "rank " + std::to_string(r.rank()) + " (stage " +
                             std::to_string(r.stage()) + ", dp " + std::to_string(r.data()) +
                             ", tp " + std::to_string(r.tensor()) + ") on " + r.node();
    WriteMetadata(out, "process_name", pid, 0, "name", Quote(name), &first);
    WriteMetadata(out, "process_sort_index", pid, 0, "sort_index", std::to_string(r.rank()),
                  &first);
    WriteMetadata(out, "thread_name", pid, kStepsThread, "name", Quote("steps"), &first);
    const bool buckets = std::any_of(r.events().begin(), r.events().end(), [](const TraceEvent& e) {
      return e.kind() == loom::v1::TRACE_EVENT_KIND_DP_BUCKET_ALL_REDUCE;
    });
    if (buckets) {
      WriteMetadata(out, "thread_name", pid, kBucketsThread, "name",
                    Quote("dp buckets (comm thread)"), &first);
    }
    for (const TraceEvent& e : r.events()) WriteEvent(out, e, pid, origin, &first);
  }
  out << "\n]}\n";
}

}  // namespace loom::client
